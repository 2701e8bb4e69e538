//! The primary's end of a standby's connection: the key checked, what the standby lacks sent
//! from the segment files, then every write of the log as it happens; the standby's synced
//! LSNs passed to the log, which answers durability 2 with them.

use super::wire::{self, Hello, MAX_WRITE_BYTES};
use super::Standby;
use crate::admission::PreLogin;
use crate::store::log::shipping::{Attached, SegmentCopy};
use crate::store::log::Shipment;
use futures::SinkExt;
use std::collections::{BTreeMap, VecDeque};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{timeout, timeout_at, Instant};
use yawc::close::CloseCode;
use yawc::frame::{Frame, OpCode};
use yawc::{HttpStream, WebSocket};

type Socket = WebSocket<HttpStream>;

/// A standby that has not answered a shipped LSN for this long counts as gone: it is dropped,
/// and durability 2 is answered 507 until one is in sync again, not kept waiting.
const STANDBY_SILENCE: Duration = Duration::from_secs(5);

/// Why the connection ended.
#[derive(Debug, thiserror::Error)]
enum Ended {
    #[error("the standby went away")]
    Gone,
    #[error("the standby sent what is not a hello or a synced LSN")]
    Unexpected,
    #[error("the standby gave a wrong key")]
    WrongKey,
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
    admitted: PreLogin,
    hello_deadline: Instant,
) {
    let mut generation = None;
    let ended = ship(
        &mut socket,
        standby,
        admitted,
        hello_deadline,
        &mut generation,
    )
    .await;
    if let Some(generation) = generation {
        standby.shipping.detach(generation);
    }
    let (code, text) = match &ended {
        Ended::WrongKey => (CloseCode::Policy, "wrong replication key"),
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
    let have: BTreeMap<u32, u64> = hello.have.into_iter().collect();
    let attached = match standby.shipping.attach(&have) {
        Ok(attached) => attached,
        Err(error) => return Ended::Read(error),
    };
    *generation = Some(attached.generation);
    tracing::info!(
        segments = attached.copies.len(),
        "a standby attached: catching up"
    );
    match catch_up_then_follow(socket, standby, attached).await {
        Ok(never) => match never {},
        Err(ended) => ended,
    }
}

async fn catch_up_then_follow(
    socket: &mut Socket,
    standby: &Standby,
    attached: Attached,
) -> Result<std::convert::Infallible, Ended> {
    let Attached {
        generation,
        truncated,
        removed,
        copies,
        repairs,
        through,
        mut shipments,
    } = attached;
    for (segment, len) in truncated {
        send(socket, &Shipment::Truncate { segment, len }).await?;
    }
    for segment in removed {
        send(socket, &Shipment::Remove { segment }).await?;
    }
    for copy in copies {
        send_copy(socket, copy).await?;
    }
    for repair in &repairs {
        send(socket, repair).await?;
    }
    // The rest of the data directory a promoted standby needs.
    let mut settings_saved = standby.settings_saved.subscribe();
    send_settings(socket, standby).await?;
    match std::fs::read(&standby.receipt_key) {
        Ok(key) => send_frame(socket, wire::encode_receipt_key(&key)).await?,
        // The SQS face has made none yet (it makes it as the node starts serving).
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Ended::Read(e)),
    }
    let mut unanswered = VecDeque::from([(through, Instant::now())]);
    let caught_up = Shipment::Through {
        lsn: through,
        sync: true,
    };
    send(socket, &caught_up).await?;
    let mut in_sync = false;
    let mut look = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            shipment = shipments.next() => {
                // This one and every other already queued, in one flush.
                let mut shipment = shipment.ok_or(Ended::Dropped)?;
                loop {
                    if let Shipment::Through { lsn, .. } = shipment {
                        unanswered.push_back((lsn, Instant::now()));
                    }
                    feed(socket, &shipment).await?;
                    match shipments.try_next() {
                        Some(next) => shipment = next,
                        None => break,
                    }
                }
                socket.flush().await.map_err(|_| Ended::Gone)?;
            }
            frame = next_data(socket) => {
                let (OpCode::Binary, payload) = frame? else {
                    return Err(Ended::Unexpected);
                };
                let lsn = wire::decode_synced(&payload).ok_or(Ended::Unexpected)?;
                standby.shipping.standby_synced(lsn);
                while unanswered.front().is_some_and(|&(shipped, _)| shipped <= lsn) {
                    unanswered.pop_front();
                }
                if !in_sync && lsn >= through {
                    in_sync = true;
                    standby.shipping.in_sync(generation);
                    tracing::info!(lsn, "the standby is in sync: durability 2 waits for it");
                }
            }
            changed = settings_saved.changed() => {
                if changed.is_ok() {
                    send_settings(socket, standby).await?;
                }
            }
            _ = look.tick() => {
                if unanswered.front().is_some_and(|(_, at)| at.elapsed() > STANDBY_SILENCE) {
                    return Err(Ended::Silent);
                }
            }
        }
    }
}

/// Sends what the standby lacks of one segment, read from the file in pieces (off the
/// runtime's threads).
async fn send_copy(socket: &mut Socket, copy: SegmentCopy) -> Result<(), Ended> {
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
            let n = read_up_to(&reader, &mut piece, offset)?;
            piece.truncate(n);
            Ok::<_, std::io::Error>(piece)
        });
        let piece = read.await.map_err(std::io::Error::other)??;
        if piece.is_empty() {
            // The file is shorter than the index says (made by `File::create`, not from a
            // spare): what is missing comes with the writes that follow.
            break;
        }
        let bytes = bytes::Bytes::from(piece);
        let next = offset + bytes.len() as u64;
        send(
            socket,
            &Shipment::Write {
                segment,
                offset,
                bytes,
            },
        )
        .await?;
        offset = next;
    }
    Ok(())
}

/// Reads into `buffer` from `offset` until it is full or the file ends; the bytes read.
fn read_up_to(file: &std::fs::File, buffer: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match file.read_at(&mut buffer[filled..], offset + filled as u64)? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

/// Sends the settings saved now (read after the change that woke us, so the latest).
async fn send_settings(socket: &mut Socket, standby: &Standby) -> Result<(), Ended> {
    send_frame(socket, wire::encode_settings(&standby.meta.saved())).await
}

async fn send_frame(socket: &mut Socket, frame: bytes::Bytes) -> Result<(), Ended> {
    socket
        .send(Frame::binary(frame))
        .await
        .map_err(|_| Ended::Gone)
}

async fn feed(socket: &mut Socket, shipment: &Shipment) -> Result<(), Ended> {
    socket
        .feed(Frame::binary(wire::encode(shipment)))
        .await
        .map_err(|_| Ended::Gone)
}

async fn send(socket: &mut Socket, shipment: &Shipment) -> Result<(), Ended> {
    socket
        .send(Frame::binary(wire::encode(shipment)))
        .await
        .map_err(|_| Ended::Gone)
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
