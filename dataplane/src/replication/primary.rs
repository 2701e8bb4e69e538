//! The primary's end of a standby's connection: the key checked, what the standby lacks sent
//! from the segment files, then every write of the log as it happens; the standby's synced
//! LSNs passed to the log, which answers durability 2 with them. Beside the log, who holds
//! which durable message (`holds`), to a standby that takes it.

use super::wire::{self, Answer, Hello, MAX_WRITE_BYTES};
use super::Standby;
use crate::admission::PreLogin;
use crate::engine::Queue;
use crate::store::log::shipping::{Attached, SegmentCopy, Shipments};
use crate::store::log::Shipment;
use futures::SinkExt;
use std::collections::VecDeque;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{timeout, timeout_at, Instant};
use yawc::close::CloseCode;
use yawc::frame::{Frame, OpCode};
use yawc::{HttpStream, WebSocket};

type Socket = WebSocket<HttpStream>;

/// A standby that has not answered a shipped LSN (or hold, or an idle standby's ping) for this
/// long counts as gone: it is dropped, and durability 2 is answered 507 until one is in sync
/// again, not kept waiting.
const STANDBY_SILENCE: Duration = Duration::from_secs(5);

/// The standby is sent the whole table of holds again once this many holds were shipped
/// since the last (or four times the table, if more): what it keeps of acked messages stays
/// bounded, a few MiB, for the cost of one table a second at 65,000 deliveries a second.
const HOLDS_AGAIN_AFTER: u64 = 65_536;

/// Why the connection ended.
#[derive(Debug, thiserror::Error)]
enum Ended {
    #[error("the standby went away")]
    Gone,
    #[error("the standby sent what is not a hello or a synced LSN")]
    Unexpected,
    #[error("the standby gave a wrong key")]
    WrongKey,
    #[error("the standby holds a copy of another log (lineage {0}) than this node's: it is not told to cut or remove it, and durability 2 is answered 507; if this node's data was lost, the queue's messages are on the standby (promote it)")]
    OtherLineage(String),
    #[error("the log dropped the standby (too far behind)")]
    Dropped,
    #[error("the standby did not answer for {STANDBY_SILENCE:?}")]
    Silent,
    #[error("reading the segment files: {0}")]
    Read(#[from] std::io::Error),
}

/// Serves one standby until it goes. Until its hello proves the key (by the login deadline,
/// `no-reply-timeout-secs`), the connection holds the pre-login slot it was admitted with, as
/// a client's does.
pub async fn serve(
    mut socket: Box<Socket>,
    standby: &Standby,
    queue: &Queue,
    admitted: PreLogin,
    hello_deadline: Instant,
) {
    let mut generation = None;
    let ended = ship(
        &mut socket,
        standby,
        queue,
        admitted,
        hello_deadline,
        &mut generation,
    )
    .await;
    if let Some(generation) = generation {
        // One dropped for its silence stopped answering that long ago: its stay ended then.
        let silent_for = match ended {
            Ended::Silent => STANDBY_SILENCE,
            _ => Duration::ZERO,
        };
        standby.shipping.detach(generation, silent_for);
    }
    let (code, text) = match &ended {
        Ended::WrongKey => (CloseCode::Policy, "wrong replication key"),
        Ended::OtherLineage(_) => (CloseCode::Policy, "the standby holds another log"),
        Ended::Unexpected => (CloseCode::Protocol, "not a replication frame"),
        _ => (CloseCode::Away, "standby dropped"),
    };
    tracing::warn!(reason = %ended, "a standby's connection ended");
    let _ = timeout(
        Duration::from_secs(1),
        socket.send(Frame::close(code, text)),
    )
    .await;
}

async fn ship(
    socket: &mut Socket,
    standby: &Standby,
    queue: &Queue,
    admitted: PreLogin,
    hello_deadline: Instant,
    generation: &mut Option<u64>,
) -> Ended {
    let hello = match timeout_at(hello_deadline, next_data(socket)).await {
        Ok(Ok((OpCode::Text, payload))) => serde_json::from_slice::<Hello>(&payload),
        Ok(Ok(_)) | Err(_) => return Ended::Unexpected,
        Ok(Err(ended)) => return ended,
    };
    let Ok(hello) = hello else {
        return Ended::Unexpected;
    };
    if !standby.key.matches(&hello.key) {
        return Ended::WrongKey;
    }
    drop(admitted);
    // A standby that followed a primary of a higher epoch: the queue has another primary,
    // and this one reached it by a name that has not moved yet.
    if let Some(theirs) = hello.epoch {
        standby.stop_if_superseded(theirs);
    }
    // A copy of another log is never cut to this one's: this node may be a fresh one whose
    // data was lost, and the standby the only holder of what was acknowledged. A copy from
    // before lineages is taken for this log's, unless this log began empty at this start.
    if !hello.have.is_empty() {
        let ours = standby.shipping.lineage();
        match &hello.lineage {
            Some(theirs) if theirs != ours => return Ended::OtherLineage(theirs.clone()),
            None if standby.shipping.began_empty() => {
                return Ended::OtherLineage("none: a copy from before lineages".into())
            }
            _ => {}
        }
    }
    let takes = Takes {
        lineage: hello.takes_lineage,
        epoch: hello.epoch.is_some(),
        holds: hello.takes_holds,
        answers_holds: hello.takes_holds && hello.answers_holds,
    };
    // It opens every segment file under the files' lock: not on the runtime's threads.
    let shipping = standby.shipping.clone();
    let attach = tokio::task::spawn_blocking(move || shipping.attach(&hello.have));
    let attached = match attach.await.map_err(std::io::Error::other) {
        Ok(Ok(attached)) => attached,
        Ok(Err(error)) | Err(error) => return Ended::Read(error),
    };
    *generation = Some(attached.generation);
    tracing::info!(
        segments = attached.copies.len(),
        "a standby attached: catching up"
    );
    let mut link = Link {
        socket,
        unanswered: VecDeque::new(),
        holds_fed: 0,
        holds_unheard: VecDeque::new(),
        pinged: None,
    };
    match catch_up_then_follow(&mut link, standby, queue, attached, takes).await {
        Ok(never) => match never {},
        Err(ended) => ended,
    }
}

/// The frames a standby said it takes, beyond those of the first standbys.
struct Takes {
    lineage: bool,
    epoch: bool,
    holds: bool,
    /// It answers how many holds it applied: deliveries wait for it (`store::log::heard`).
    answers_holds: bool,
}

async fn catch_up_then_follow(
    link: &mut Link<'_>,
    standby: &Standby,
    queue: &Queue,
    attached: Attached,
    takes: Takes,
) -> Result<std::convert::Infallible, Ended> {
    let Attached {
        generation,
        truncated,
        copies,
        repairs,
        removed,
        through,
        mut shipments,
    } = attached;
    // First: which primary this is (a standby given a higher epoch follows it no further),
    // and that the standby's copy is of this log from now on.
    if takes.epoch {
        link.send_frame(wire::encode_epoch(standby.epoch())).await?;
    }
    if takes.lineage {
        link.send_frame(wire::encode_lineage(standby.shipping.lineage()))
            .await?;
    }
    for (segment, len) in truncated {
        link.send(&Shipment::Truncate { segment, len }).await?;
    }
    for copy in copies {
        send_copy(link, copy).await?;
    }
    for repair in &repairs {
        link.send(repair).await?;
    }
    // The rest of the data directory a promoted standby needs.
    let mut settings_saved = standby.settings_saved.subscribe();
    link.send_frame(wire::encode_settings(&standby.meta.saved()))
        .await?;
    match std::fs::read(&standby.receipt_key) {
        Ok(key) => link.send_frame(wire::encode_receipt_key(&key)).await?,
        // The SQS face has made none yet (it makes it as the node starts serving).
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Ended::Read(e)),
    }
    // Only now: the standby syncs the copies before it removes anything.
    for segment in removed {
        link.send(&Shipment::Remove { segment }).await?;
    }
    let caught_up = Shipment::Through {
        lsn: through,
        sync: true,
    };
    link.send(&caught_up).await?;
    // Who holds what now, queued after the changes since the attach; again whenever the
    // standby keeps many the table no longer has (`LogStore::ship_hold`).
    let mut table_len = 0;
    if takes.holds {
        table_len = queue.ship_holds(&standby.shipping) as u64;
    }
    let mut in_sync = false;
    let mut look = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            shipment = shipments.next() => {
                let shipment = shipment.ok_or(Ended::Dropped)?;
                link.ship_queued(shipment, &mut shipments, &takes).await?;
            }
            frame = next_answer(link.socket) => {
                let Some(payload) = frame? else {
                    // A pong: it is there.
                    link.pinged = None;
                    continue;
                };
                let lsn = match wire::decode_answer(&payload).ok_or(Ended::Unexpected)? {
                    Answer::Synced(lsn) => lsn,
                    Answer::HoldsApplied(count) => {
                        if let Some(number) = link.holds_applied(count) {
                            standby.shipping.holds_heard(generation, number);
                        }
                        continue;
                    }
                };
                standby.shipping.standby_synced(generation, lsn);
                link.answered(lsn);
                if !in_sync && lsn >= through {
                    in_sync = true;
                    standby.shipping.in_sync(generation, takes.answers_holds);
                    tracing::info!(lsn, "the standby is in sync: durability 2 waits for it");
                }
            }
            changed = settings_saved.changed() => {
                if changed.is_ok() {
                    link.send_frame(wire::encode_settings(&standby.meta.saved())).await?;
                }
            }
            _ = look.tick() => {
                let waited_for = !link.unanswered.is_empty() || !link.holds_unheard.is_empty();
                if Instant::now() >= link.deadline() && (waited_for || link.pinged.is_some()) {
                    return Err(Ended::Silent);
                }
                if !waited_for && link.pinged.is_none() {
                    link.ping().await?;
                }
                if takes.holds && standby.shipping.holds_shipped() > HOLDS_AGAIN_AFTER.max(table_len * 4) {
                    table_len = queue.ship_holds(&standby.shipping) as u64;
                }
            }
        }
    }
}

/// The standby's connection, with the rule that keeps a stuck standby from holding durability
/// 2 (or deliveries) for long: every send has until the oldest unanswered `Through` (or hold)
/// is `STANDBY_SILENCE` old (or `STANDBY_SILENCE` from its start when none is), so a standby
/// that stops reading, whose socket then fills, is dropped as surely as one that stops
/// answering.
struct Link<'a> {
    socket: &'a mut Socket,
    /// `Through`s sent and not yet answered, with when they were sent.
    unanswered: VecDeque<(u64, Instant)>,
    /// Hold changes sent on this connection.
    holds_fed: u64,
    /// For each flush that sent holds and is not yet answered: how many had been sent then,
    /// the number of the last ([`crate::store::log::heard`]), and when.
    holds_unheard: VecDeque<(u64, u64, Instant)>,
    /// When an idle standby was asked to answer (a WebSocket ping), until it has.
    pinged: Option<Instant>,
}

impl Link<'_> {
    fn deadline(&self) -> Instant {
        let through = self.unanswered.front().map(|&(_, at)| at);
        let hold = self.holds_unheard.front().map(|&(_, _, at)| at);
        let since = [through, hold, self.pinged].into_iter().flatten().min();
        since.unwrap_or_else(Instant::now) + STANDBY_SILENCE
    }

    /// Sends `first` and every other shipment already queued, in one flush.
    async fn ship_queued(
        &mut self,
        first: Shipment,
        shipments: &mut Shipments,
        takes: &Takes,
    ) -> Result<(), Ended> {
        let holds_fed = self.holds_fed;
        let mut shipment = first;
        loop {
            let hold = matches!(shipment, Shipment::Hold(_));
            // (A table queued by the task of a connection this one replaced may reach a
            // standby that does not take holds.)
            if takes.holds || !hold {
                self.feed(&shipment).await?;
            }
            if takes.holds && hold {
                self.holds_fed += 1;
            }
            match shipments.try_next() {
                Some(next) => shipment = next,
                None => break,
            }
        }
        if takes.answers_holds && self.holds_fed > holds_fed {
            let fed = (self.holds_fed, shipments.last_hold(), Instant::now());
            self.holds_unheard.push_back(fed);
        }
        self.flush().await
    }

    /// The standby has applied `count` hold changes: the number of the last one sent by then,
    /// if it answers a flush not answered before.
    fn holds_applied(&mut self, count: u64) -> Option<u64> {
        let mut heard = None;
        while let Some(&(fed, number, _)) = self.holds_unheard.front() {
            if fed > count {
                break;
            }
            heard = Some(number);
            self.holds_unheard.pop_front();
        }
        heard
    }

    /// The standby synced everything up to `lsn`.
    fn answered(&mut self, lsn: u64) {
        while self
            .unanswered
            .front()
            .is_some_and(|&(sent, _)| sent <= lsn)
        {
            self.unanswered.pop_front();
        }
    }

    /// Queues `shipment` on the socket (a write too big for one frame as several).
    async fn feed(&mut self, shipment: &Shipment) -> Result<(), Ended> {
        match shipment {
            Shipment::Write {
                segment,
                offset,
                bytes,
            } if bytes.len() > MAX_WRITE_BYTES => {
                for at in (0..bytes.len()).step_by(MAX_WRITE_BYTES) {
                    let end = (at + MAX_WRITE_BYTES).min(bytes.len());
                    let piece = Shipment::Write {
                        segment: *segment,
                        offset: offset + at as u64,
                        bytes: bytes.slice(at..end),
                    };
                    self.feed_frame(wire::encode(&piece)).await?;
                }
                Ok(())
            }
            _ => {
                if let Shipment::Through { lsn, .. } = shipment {
                    self.unanswered.push_back((*lsn, Instant::now()));
                }
                self.feed_frame(wire::encode(shipment)).await
            }
        }
    }

    async fn feed_frame(&mut self, frame: bytes::Bytes) -> Result<(), Ended> {
        let fed = timeout_at(self.deadline(), self.socket.feed(Frame::binary(frame))).await;
        fed.map_err(|_| Ended::Silent)?.map_err(|_| Ended::Gone)
    }

    async fn flush(&mut self) -> Result<(), Ended> {
        let flushed = timeout_at(self.deadline(), self.socket.flush()).await;
        flushed.map_err(|_| Ended::Silent)?.map_err(|_| Ended::Gone)
    }

    async fn send(&mut self, shipment: &Shipment) -> Result<(), Ended> {
        self.feed(shipment).await?;
        self.flush().await
    }

    async fn send_frame(&mut self, frame: bytes::Bytes) -> Result<(), Ended> {
        self.feed_frame(frame).await?;
        self.flush().await
    }

    /// Asks a standby that nothing waits for to answer: one that is silent then (a hung
    /// process or machine) is dropped as surely as one that leaves a sync unanswered, so its
    /// node reports it absent, and the control plane replaces one absent for long.
    async fn ping(&mut self) -> Result<(), Ended> {
        self.pinged = Some(Instant::now());
        let pinged = timeout_at(
            self.deadline(),
            self.socket.send(Frame::ping(bytes::Bytes::new())),
        );
        pinged
            .await
            .map_err(|_| Ended::Silent)?
            .map_err(|_| Ended::Gone)
    }
}

/// Sends what the standby lacks of one segment, read from the file in pieces (off the
/// runtime's threads).
async fn send_copy(link: &mut Link<'_>, copy: SegmentCopy) -> Result<(), Ended> {
    let SegmentCopy {
        segment,
        file,
        from,
        to,
    } = copy;
    let file = Arc::new(file);
    let mut offset = from;
    while offset < to {
        let len = (to - offset).min(MAX_WRITE_BYTES as u64) as usize;
        let reader = file.clone();
        let read = tokio::task::spawn_blocking(move || {
            let mut piece = vec![0; len];
            reader.read_exact_at(&mut piece, offset)?;
            Ok::<_, std::io::Error>(piece)
        });
        // A file shorter than its written part is an error, never a copy said to be whole.
        let piece = read.await.map_err(std::io::Error::other)??;
        let bytes = bytes::Bytes::from(piece);
        let next = offset + bytes.len() as u64;
        let write = Shipment::Write {
            segment,
            offset,
            bytes,
        };
        link.send(&write).await?;
        offset = next;
    }
    Ok(())
}

/// The standby's next answer (a binary frame), or None for a pong (pings are answered by
/// yawc and skipped).
async fn next_answer(socket: &mut Socket) -> Result<Option<bytes::Bytes>, Ended> {
    loop {
        let frame = socket.next_frame().await.map_err(|_| Ended::Gone)?;
        match frame.opcode() {
            OpCode::Binary => return Ok(Some(frame.into_payload())),
            OpCode::Pong => return Ok(None),
            OpCode::Close => return Err(Ended::Gone),
            OpCode::Text => return Err(Ended::Unexpected),
            OpCode::Ping | OpCode::Continuation => continue,
        }
    }
}

/// The next text or binary frame (pings and pongs are answered by yawc and skipped).
async fn next_data(socket: &mut Socket) -> Result<(OpCode, bytes::Bytes), Ended> {
    loop {
        let frame = socket.next_frame().await.map_err(|_| Ended::Gone)?;
        match frame.opcode() {
            OpCode::Text | OpCode::Binary => return Ok((frame.opcode(), frame.into_payload())),
            OpCode::Close => return Err(Ended::Gone),
            OpCode::Ping | OpCode::Pong | OpCode::Continuation => continue,
        }
    }
}
