//! The standby's end (`dataplane --standby-of URL`): it serves no client. It connects to the
//! primary, says what it holds, writes every shipment at its place in the mirror of the
//! primary's segment files, and answers how far it has synced: it syncs once for everything
//! it could read before the sync (a group commit, as the primary's syncer), so a round of
//! durability-2 publishes costs one sync here, overlapped with the primary's own.
//!
//! A lost connection is opened again a second later, and the catch-up sends only what is
//! missing. A failed sync ends the process (exit 1): like the primary's log, it never trusts
//! a retry of a sync that failed, and the primary answers durability 2 with 507 until a
//! standby is in sync again.

use super::wire::{self, Answer, Hello, Sent};
use super::{epoch, holds};
use crate::store::data_dir;
use crate::store::log::lineage;
use crate::store::log::mirror::Mirror;
use crate::store::log::Shipment;
use crate::store::meta::Meta;
use futures::{FutureExt, SinkExt, StreamExt};
use qe_shared::backoff::Backoff;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::net::TcpStream;
use yawc::frame::{Frame, OpCode};
use yawc::{MaybeTlsStream, Options, WebSocket};

/// What the standby needs.
pub struct StandbyConfig {
    /// The primary's node address, `ws://` or `wss://` (the path is `/replicate`).
    pub primary: url::Url,
    pub key: String,
    pub data_dir: PathBuf,
    /// Roots a `wss://` primary's certificate is checked against (its queue's CA).
    pub roots: rustls::RootCertStore,
    /// Where to connect instead of resolving the primary's name.
    pub connect: Option<std::net::SocketAddr>,
    /// The queue's epoch as given: no primary of a lower one is followed.
    pub epoch: u64,
}

/// Why following the primary stopped.
#[derive(Debug, thiserror::Error)]
pub enum Stopped {
    #[error("cannot reach the primary: {0}")]
    Connect(String),
    #[error("the primary went away")]
    Gone,
    #[error("the primary closed the connection: {0}")]
    Closed(String),
    #[error("the primary sent what is not a shipment")]
    Unexpected,
    #[error("the primary is at epoch {theirs} (0: from before epochs) and this standby follows none below {at_least}: a former primary, still reached by the queue's name")]
    OlderPrimary { theirs: u64, at_least: u64 },
    /// Final: the process stops.
    #[error("the mirror's disk failed: {0}")]
    Disk(std::io::Error),
}

/// How long to wait before connecting again; it doubles while connections end before the
/// standby has caught up (a primary that refuses it, one that is not there), up to the most.
const RECONNECT_AFTER: Duration = Duration::from_secs(1);
const RECONNECT_AFTER_AT_MOST: Duration = Duration::from_secs(5);

/// Follows the primary until a disk fails (then returns the error).
pub async fn run(config: StandbyConfig) -> Stopped {
    let mut copy = match Copy::open(&config.data_dir, config.epoch) {
        Ok(copy) => copy,
        Err(error) => return Stopped::Disk(error),
    };
    let mut backoff = Backoff::new(RECONNECT_AFTER, RECONNECT_AFTER_AT_MOST);
    loop {
        let stopped = follow(&config, &mut copy, &mut backoff).await;
        let wait = backoff.next_wait();
        match stopped {
            Stopped::Disk(error) => return Stopped::Disk(error),
            stopped => {
                tracing::warn!(reason = %stopped, retry_in = ?wait, "following the primary: connecting again")
            }
        }
        tokio::time::sleep(wait).await;
    }
}

/// Follows the primary on one connection; `backoff` starts again once it has caught up.
async fn follow(config: &StandbyConfig, copy: &mut Copy, backoff: &mut Backoff) -> Stopped {
    let mut socket = match connect(config).await {
        Ok(socket) => socket,
        Err(reason) => return Stopped::Connect(reason),
    };
    let have = match copy.mirror.have() {
        Ok(have) => have,
        Err(error) => return Stopped::Disk(error),
    };
    let lineage = match lineage::of(&copy.data_dir.join(data_dir::MESSAGES)) {
        Ok(lineage) => lineage,
        Err(error) => return Stopped::Disk(error),
    };
    // What it followed, never what it was given: a primary that hears of a higher epoch
    // stops, and one promoted a moment ago may not have been given its epoch yet.
    let hello = Hello {
        key: config.key.clone(),
        have,
        lineage,
        takes_lineage: true,
        epoch: Some(copy.kept.epoch),
        takes_holds: true,
        answers_holds: true,
    };
    copy.primary_epoch = None;
    let hello = serde_json::to_string(&hello).expect("a hello serializes");
    if socket.send(Frame::text(hello)).await.is_err() {
        return Stopped::Gone;
    }
    tracing::info!(primary = %config.primary, "following the primary");
    let mut synced = Synced::default();
    let mut holds = HoldsApplied::default();
    loop {
        // Everything the primary has sent so far, then at most one sync for all of it: now
        // if a durability-2 change waits for it, else within a second.
        let due = synced.unsynced_since.map(|since| since + SYNC_WITHIN);
        let mut sync_now = false;
        let frame = match due {
            Some(due) => tokio::time::timeout_at(due.into(), socket.next_frame())
                .await
                .ok(),
            None => Some(socket.next_frame().await),
        };
        match frame {
            // The second is up.
            None => sync_now = true,
            Some(Err(_)) => return Stopped::Gone,
            Some(Ok(mut frame)) => loop {
                match apply(copy, frame) {
                    Ok(Applied::Log(shipment)) => {
                        synced
                            .unsynced_since
                            .get_or_insert_with(std::time::Instant::now);
                        if let Shipment::Through { lsn, sync } = shipment {
                            synced.applied = Some(lsn);
                            sync_now |= sync;
                        }
                    }
                    Ok(Applied::Hold) => holds.applied += 1,
                    // A ping, the settings or the receipt key (saved and synced already).
                    Ok(Applied::Other) => {}
                    Err(stopped) => return stopped,
                }
                match socket.next().now_or_never() {
                    Some(Some(next)) => frame = next,
                    Some(None) => return Stopped::Gone,
                    None => break,
                }
            },
        }
        if let Err(error) = copy.holds.flush() {
            return Stopped::Disk(error);
        }
        // The holds first: a delivery on the primary waits for this, a sync only for
        // durability 2.
        if holds.applied != holds.answered {
            holds.answered = holds.applied;
            let answer = wire::encode_answer(Answer::HoldsApplied(holds.applied));
            if socket.send(Frame::binary(answer)).await.is_err() {
                return Stopped::Gone;
            }
        }
        if !sync_now {
            continue;
        }
        if let Err(error) = copy.mirror.sync() {
            return Stopped::Disk(error);
        }
        synced.unsynced_since = None;
        let Some(lsn) = synced.applied.filter(|&lsn| Some(lsn) != synced.answered) else {
            continue;
        };
        if synced.answered.is_none() {
            tracing::info!(lsn, "caught up with the primary");
            backoff.reset();
            if let Err(error) = epoch::caught_up(&copy.log_dir(), &mut copy.kept) {
                return Stopped::Disk(std::io::Error::other(error));
            }
        }
        synced.answered = Some(lsn);
        if socket
            .send(Frame::binary(wire::encode_answer(Answer::Synced(lsn))))
            .await
            .is_err()
        {
            return Stopped::Gone;
        }
    }
}

/// Unsynced writes are synced at the latest this long after they came (durability 1's
/// promise, as on the primary).
const SYNC_WITHIN: Duration = Duration::from_secs(1);

/// How far the standby is, on one connection.
#[derive(Default)]
struct Synced {
    /// The LSN of the last `Through` applied.
    applied: Option<u64>,
    /// The LSN last answered as synced.
    answered: Option<u64>,
    /// When the oldest write not yet synced came.
    unsynced_since: Option<std::time::Instant>,
}

/// Hold changes applied on one connection, and how many of them were last answered: the
/// primary counts the ones it sent the same way ([`super::primary`]).
#[derive(Default)]
struct HoldsApplied {
    applied: u64,
    answered: u64,
}

/// What one frame from the primary was.
enum Applied {
    /// A shipment of the log, written to the mirror.
    Log(Shipment),
    /// A hold change, applied to the journal's table.
    Hold,
    /// A ping, the epoch, the lineage, the settings or the receipt key.
    Other,
}

/// The standby's copy of what a promoted node needs of the primary's data directory: the
/// message log, the saved settings, the SQS receipt key. (Not the history: the primary
/// reports its own records.)
struct Copy {
    mirror: Mirror,
    meta: Meta,
    data_dir: PathBuf,
    /// The epochs it keeps.
    kept: epoch::Kept,
    /// The epoch it was given: it follows no primary below this or what it keeps.
    given_epoch: u64,
    /// The epoch the primary said on this connection; None until it says.
    primary_epoch: Option<u64>,
    /// Who holds which message on the primary ([`holds`]).
    holds: holds::Journal,
}

impl Copy {
    fn open(data_dir: &Path, given_epoch: u64) -> std::io::Result<Copy> {
        let mirror = Mirror::open(&data_dir.join(data_dir::MESSAGES))?;
        let meta = Meta::open(&data_dir.join(data_dir::META)).map_err(std::io::Error::other)?;
        let kept =
            epoch::kept(&data_dir.join(data_dir::MESSAGES)).map_err(std::io::Error::other)?;
        Ok(Copy {
            mirror,
            meta,
            data_dir: data_dir.to_path_buf(),
            kept,
            given_epoch,
            primary_epoch: None,
            holds: holds::Journal::open(data_dir)?,
        })
    }

    fn log_dir(&self) -> PathBuf {
        self.data_dir.join(data_dir::MESSAGES)
    }

    /// The lowest epoch a primary it follows may be at.
    fn epoch_at_least(&self) -> u64 {
        self.kept.floor().max(self.given_epoch)
    }

    /// The primary said its epoch: followed if it is not lower than the copy's, and kept if
    /// higher.
    fn primary_at(&mut self, theirs: u64) -> Result<(), Stopped> {
        let at_least = self.epoch_at_least();
        if theirs < at_least {
            return Err(Stopped::OlderPrimary { theirs, at_least });
        }
        if theirs > self.kept.epoch {
            let kept = epoch::follow(&self.log_dir(), &mut self.kept, theirs);
            kept.map_err(|error| Stopped::Disk(std::io::Error::other(error)))?;
        }
        self.primary_epoch = Some(theirs);
        Ok(())
    }
}

/// Applies one frame from the primary.
fn apply(copy: &mut Copy, frame: Frame) -> Result<Applied, Stopped> {
    match frame.opcode() {
        OpCode::Binary => {}
        OpCode::Close => {
            let reason = frame
                .close_reason()
                .ok()
                .flatten()
                .unwrap_or("")
                .to_string();
            return Err(Stopped::Closed(reason));
        }
        OpCode::Text => return Err(Stopped::Unexpected),
        OpCode::Ping | OpCode::Pong | OpCode::Continuation => return Ok(Applied::Other),
    }
    // The standby does nothing else: its one task may block on the disk.
    let sent = wire::decode_sent(&frame.into_payload()).ok_or(Stopped::Unexpected)?;
    // The epoch comes first; a primary that does not say it is from before epochs (0).
    match (&sent, copy.primary_epoch) {
        (Sent::Epoch(theirs), _) => {
            copy.primary_at(*theirs)?;
            return Ok(Applied::Other);
        }
        (_, None) => copy.primary_at(0)?,
        _ => {}
    }
    match sent {
        Sent::Log(Shipment::Hold(change)) => {
            copy.holds.apply(change);
            Ok(Applied::Hold)
        }
        Sent::Log(shipment) => {
            copy.mirror.apply(&shipment).map_err(Stopped::Disk)?;
            Ok(Applied::Log(shipment))
        }
        Sent::Settings(settings) => {
            let saved = copy.meta.save_copy(&settings);
            saved.map_err(|error| Stopped::Disk(std::io::Error::other(format!("{error:?}"))))?;
            tracing::info!(
                saved = settings.values.len(),
                "the primary's settings are saved here"
            );
            Ok(Applied::Other)
        }
        Sent::Lineage(lineage) => {
            let dir = copy.data_dir.join(data_dir::MESSAGES);
            if lineage::of(&dir).map_err(Stopped::Disk)?.as_deref() != Some(lineage.as_str()) {
                lineage::keep(&dir, &lineage).map_err(Stopped::Disk)?;
            }
            Ok(Applied::Other)
        }
        Sent::ReceiptKey(key) => {
            let path = copy.data_dir.join(data_dir::SQS_RECEIPT_KEY);
            if std::fs::read(&path).ok().as_deref() != Some(&key[..]) {
                qe_shared::files::write_private(&path, &key).map_err(Stopped::Disk)?;
            }
            Ok(Applied::Other)
        }
        Sent::Epoch(_) => Ok(Applied::Other),
    }
}

type Socket = WebSocket<MaybeTlsStream<TcpStream>>;

async fn connect(config: &StandbyConfig) -> Result<Socket, String> {
    let url = config
        .primary
        .join(super::PATH)
        .map_err(|e| e.to_string())?;
    let host = url.host_str().ok_or("no host")?.to_string();
    let port = url.port_or_known_default().ok_or("no port")?;
    let tcp = match config.connect {
        Some(address) => TcpStream::connect(address).await,
        None => TcpStream::connect((host.trim_matches(['[', ']']), port)).await,
    };
    let tcp = tcp.map_err(|e| e.to_string())?;
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    // A primary whose machine vanished sends no FIN: the standby would wait on its
    // connection for ever, and never catch up with the primary when it is back.
    qe_serve::notice_dead_peers(&tcp);
    let io: MaybeTlsStream<TcpStream> = match url.scheme() {
        "wss" => {
            let roots = config.roots.clone();
            let name = rustls::pki_types::ServerName::try_from(host.trim_matches(['[', ']']))
                .map_err(|e| e.to_string())?
                .to_owned();
            // TLS 1.2 and 1.3 only, as everywhere (`qe_tls`).
            let connector = tokio_rustls::TlsConnector::from(qe_tls::client_config(roots));
            let tls = connector.connect(name, tcp).await;
            tls.map_err(|e| format!("TLS: {e}"))?.into()
        }
        _ => tcp.into(),
    };
    // The primary's frames are at most a write piece and its header.
    let limit = wire::MAX_WRITE_BYTES + 64;
    let options = Options::default()
        .with_no_delay()
        .with_max_payload_read(limit)
        .with_max_read_buffer(2 * limit);
    WebSocket::handshake(url, io, options)
        .await
        .map_err(|e| format!("WebSocket upgrade: {e}"))
}

/// The roots in a PEM file; there must be some.
pub fn roots_from(path: &Path) -> Result<rustls::RootCertStore, String> {
    let pem = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let roots = qe_tls::roots_from_pem(&pem);
    match roots.is_empty() {
        true => Err(format!("{}: no certificate", path.display())),
        false => Ok(roots),
    }
}

/// `dataplane --standby-of URL --replication-key KEY --data-dir DIR [--standby-ca PEM]
/// [--standby-connect ADDR] [--epoch N]` (the key also from `QE_REPLICATION_KEY`):
/// follows the primary until its disk fails (exit 1) or the flags are wrong (exit 2).
pub async fn run_flags(flags: crate::config::Flags) -> std::process::ExitCode {
    let usage = |message: String| {
        eprintln!("dataplane: {message}");
        std::process::ExitCode::from(2)
    };
    let primary = flags.standby_of.as_deref().unwrap_or_default();
    let primary = match url::Url::parse(primary) {
        Ok(url) if matches!(url.scheme(), "ws" | "wss") => url,
        _ => {
            return usage(format!(
                "--standby-of {primary}: not a ws:// or wss:// address"
            ))
        }
    };
    let Some(data_dir) = flags.data_dir else {
        return usage("--data-dir is required".into());
    };
    let roots = match flags.standby_ca.as_deref().map(roots_from) {
        Some(Ok(roots)) => roots,
        Some(Err(error)) => return usage(error),
        None => rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        },
    };
    let config = StandbyConfig {
        primary,
        key: flags.replication_key.unwrap_or_default(),
        data_dir,
        roots,
        connect: flags.standby_connect,
        epoch: flags.epoch.unwrap_or(0),
    };
    let stopped = run(config).await;
    eprintln!("dataplane: the standby stops: {stopped}");
    std::process::ExitCode::FAILURE
}
