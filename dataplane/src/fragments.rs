//! Watching for a message sent in several frames that does not arrive whole in time.
//!
//! yawc reassembles fragmented messages out of sight, and checks its own fragment timeout only
//! when a later fragment arrives, so a client that sends the first fragment and stops is never
//! caught. [`FragmentWatch`] reads the client's bytes on their way to yawc, follows the frame
//! headers (after the HTTP upgrade request), and notes when an unfinished message began; the
//! connection closes with 1008 if that same message is still unfinished after
//! `message-timeout-secs`.
//!
//! It also stops at a reserved opcode: yawc would close that connection with 1003, where the
//! manual's table wants 1002. The watch ends the stream there instead (so yawc sends nothing)
//! and notes why; the connection closes with 1002.
//!
//! And it keeps the pre-login frame budget (see `admission`): until the login succeeds, the
//! data frames' payloads may add up to [`PRE_LOGIN_FRAME_BYTES`]; a bigger login (a publish in
//! the login) first takes its bytes from the pool all connections share, and until it has
//! them the watch passes nothing of its payload to yawc, which so never buffers it. A login
//! frame bigger than any `max-ws-msg-len` ends the stream (the connection closes with 1009).
//! A compressed login is held to the budget once inflated too ([`Assembly::hold_for_login`]).

use crate::admission::PRE_LOGIN_FRAME_BYTES;
use qe_shared::settings::Setting;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{AcquireError, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// When the client's unfinished fragmented message began, shared with the connection.
#[derive(Debug)]
pub struct Assembly {
    /// Milliseconds since `epoch` when it began, plus one; 0 when no message is unfinished.
    started: AtomicU64,
    epoch: Instant,
    /// Rung when a fragmented message begins.
    began: Notify,
    /// The client sent a frame with a reserved opcode.
    violated: AtomicBool,
    /// Before its login, the client sent more than any `max-ws-msg-len` allows.
    too_big: AtomicBool,
    /// The login succeeded: the pre-login budget no longer applies.
    logged_in: AtomicBool,
    /// Bytes of the shared pool this connection's login frame holds.
    reserved: Mutex<Option<OwnedSemaphorePermit>>,
    /// The pool bigger login frames take their bytes from.
    big_logins: Arc<Semaphore>,
}

impl Assembly {
    /// The watch of one connection; bigger login frames take bytes from `big_logins`.
    pub fn new(big_logins: Arc<Semaphore>) -> Arc<Assembly> {
        Arc::new(Assembly {
            started: AtomicU64::new(0),
            epoch: Instant::now(),
            began: Notify::new(),
            violated: AtomicBool::new(false),
            too_big: AtomicBool::new(false),
            logged_in: AtomicBool::new(false),
            reserved: Mutex::new(None),
            big_logins,
        })
    }

    /// Whether the client broke the protocol in a way the watch stopped at.
    pub fn violated(&self) -> bool {
        self.violated.load(Ordering::Relaxed)
    }

    /// Whether the watch stopped at a login frame bigger than any `max-ws-msg-len`.
    pub fn too_big(&self) -> bool {
        self.too_big.load(Ordering::Relaxed)
    }

    /// The login succeeded: frames are no longer held to the pre-login budget, and the
    /// bytes the login took from the pool go back.
    pub fn logged_in(&self) {
        self.logged_in.store(true, Ordering::Relaxed);
        self.lock_reserved().take();
    }

    fn is_logged_in(&self) -> bool {
        self.logged_in.load(Ordering::Relaxed)
    }

    fn lock_reserved(&self) -> std::sync::MutexGuard<'_, Option<OwnedSemaphorePermit>> {
        self.reserved.lock().expect("never poisoned")
    }

    /// Bytes of the pool held now.
    fn reserved_bytes(&self) -> usize {
        self.lock_reserved().as_ref().map_or(0, |p| p.num_permits())
    }

    /// Makes sure this connection holds `bytes` of the pool for its login, taking what it
    /// lacks now or not at all: for an inflated login bigger than the budget, which is
    /// already in memory (its compressed form fitted), so it must not wait holding it.
    pub fn hold_for_login(&self, bytes: usize) -> bool {
        if bytes <= PRE_LOGIN_FRAME_BYTES {
            return true;
        }
        let lacking = bytes.saturating_sub(self.reserved_bytes());
        if lacking == 0 {
            return true;
        }
        match self
            .big_logins
            .clone()
            .try_acquire_many_owned(lacking as u32)
        {
            Ok(permit) => {
                self.reserve(permit);
                true
            }
            Err(_) => false,
        }
    }

    /// Adds `permit`'s bytes to what this connection holds.
    fn reserve(&self, permit: OwnedSemaphorePermit) {
        let mut reserved = self.lock_reserved();
        match reserved.as_mut() {
            Some(held) => held.merge(permit),
            None => *reserved = Some(permit),
        }
    }

    fn begin(&self) {
        let now = self.epoch.elapsed().as_millis() as u64 + 1;
        self.started.store(now, Ordering::Relaxed);
        self.began.notify_one();
    }

    fn end(&self) {
        self.started.store(0, Ordering::Relaxed);
    }

    /// Resolves when a fragmented message has stayed unfinished for `limit`.
    pub async fn overdue(&self, limit: Duration) {
        loop {
            let started = self.started.load(Ordering::Relaxed);
            if started == 0 {
                self.began.notified().await;
                continue;
            }
            let deadline = self.epoch + Duration::from_millis(started - 1) + limit;
            tokio::time::sleep_until(deadline).await;
            if self.started.load(Ordering::Relaxed) == started {
                return;
            }
        }
    }
}

/// Where the reader is in the client's byte stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    /// An HTTP request, until its blank line; `matched` counts bytes of "\r\n\r\n" seen.
    /// Frames follow only a request that asks for a WebSocket; after any other (answered 400,
    /// which closes the connection) the bytes are not frames.
    Request { matched: usize },
    /// A frame header, `have` of its bytes read so far.
    Header { have: usize },
    /// A frame's payload: this many bytes still to skip.
    Payload { left: u64 },
}

/// Waiting for bytes of the pool of bigger login frames.
type Acquiring = Pin<Box<dyn Future<Output = Result<OwnedSemaphorePermit, AcquireError>> + Send>>;

/// A stream whose incoming bytes are followed frame by frame.
pub struct FragmentWatch<S> {
    inner: S,
    assembly: Arc<Assembly>,
    reading: Reading,
    /// The header being read (at most 14 bytes).
    header: [u8; 14],
    /// The current HTTP request's bytes, lower-cased (the first few KiB).
    request: Vec<u8>,
    /// Payload bytes of the data frames before the login.
    pre_login_bytes: usize,
    /// Bytes read but not passed on yet: they follow a login frame's header whose payload
    /// waits for its bytes of the pool.
    held: Vec<u8>,
    acquiring: Option<Acquiring>,
}

/// How much of a request is kept to see whether it asks for a WebSocket.
const REQUEST_KEPT: usize = 8 << 10;

impl<S> FragmentWatch<S> {
    pub fn new(inner: S, assembly: Arc<Assembly>) -> FragmentWatch<S> {
        FragmentWatch {
            inner,
            assembly,
            reading: Reading::Request { matched: 0 },
            header: [0; 14],
            request: Vec::new(),
            pre_login_bytes: 0,
            held: Vec::new(),
            acquiring: None,
        }
    }

    /// Follows `bytes`; returns how many of them may be passed on now. It stops early after
    /// a login frame's header whose payload must first get its bytes of the pool (then
    /// `acquiring` waits for them).
    fn observe(&mut self, all: &[u8]) -> usize {
        let mut bytes = all;
        while !bytes.is_empty() {
            if self.acquiring.is_some() {
                break;
            }
            match self.reading {
                Reading::Request { matched } => {
                    let end = b"\r\n\r\n";
                    let byte = bytes[0];
                    bytes = &bytes[1..];
                    if self.request.len() < REQUEST_KEPT {
                        self.request.push(byte.to_ascii_lowercase());
                    }
                    let matched = match byte == end[matched] {
                        true => matched + 1,
                        false if byte == b'\r' => 1,
                        false => 0,
                    };
                    self.reading = match matched {
                        4 if self.asks_for_websocket() => {
                            self.request = Vec::new(); // not needed again
                            Reading::Header { have: 0 }
                        }
                        4 => {
                            self.request.clear();
                            Reading::Request { matched: 0 }
                        }
                        _ => Reading::Request { matched },
                    };
                }
                Reading::Header { have } => {
                    // As much of the header as there is (a header is read whole at once
                    // when it is not split between reads; bytes copied past its end are
                    // the payload's, never read from `header`).
                    let copied = (self.header.len() - have).min(bytes.len());
                    self.header[have..have + copied].copy_from_slice(&bytes[..copied]);
                    let known = have + copied;
                    self.reading = match header_len(&self.header[..known]) {
                        Some(len) if len <= known => {
                            bytes = &bytes[len - have..];
                            self.header_done()
                        }
                        _ => {
                            bytes = &bytes[copied..];
                            Reading::Header { have: known }
                        }
                    };
                }
                Reading::Payload { left } => {
                    let skip = (left as usize).min(bytes.len());
                    bytes = &bytes[skip..];
                    self.reading = match left - skip as u64 {
                        0 => Reading::Header { have: 0 },
                        left => Reading::Payload { left },
                    };
                }
            }
        }
        all.len() - bytes.len()
    }

    /// Holds a data frame before the login to the budget: its payload of `len` bytes must
    /// fit in [`PRE_LOGIN_FRAME_BYTES`] with the others, or take its bytes from the pool.
    fn count_pre_login(&mut self, len: u64) {
        let biggest = Setting::MaxWsMsgLen.range().1 as usize;
        self.pre_login_bytes = self.pre_login_bytes.saturating_add(len as usize);
        if self.pre_login_bytes <= PRE_LOGIN_FRAME_BYTES {
            return;
        }
        if self.pre_login_bytes > biggest {
            self.assembly.too_big.store(true, Ordering::Relaxed);
            return;
        }
        // A frame that does not fit takes all its bytes from the pool, not just the excess.
        let needed = self.pre_login_bytes - self.assembly.reserved_bytes();
        let pool = self.assembly.big_logins.clone();
        match pool.clone().try_acquire_many_owned(needed as u32) {
            Ok(permit) => self.assembly.reserve(permit),
            Err(_) => self.acquiring = Some(Box::pin(pool.acquire_many_owned(needed as u32))),
        }
    }

    /// Whether the stream ends here for yawc: a reserved opcode, or a login too big.
    fn stopped(&self) -> bool {
        self.assembly.violated() || self.assembly.too_big()
    }

    fn asks_for_websocket(&self) -> bool {
        self.request.windows(9).any(|w| w == b"websocket")
    }

    /// A whole header is read: note where messages begin and end; skip the payload.
    fn header_done(&mut self) -> Reading {
        let fin = self.header[0] & 0x80 != 0;
        let opcode = self.header[0] & 0x0F;
        match (opcode, fin) {
            (0x1 | 0x2, false) => self.assembly.begin(),
            (0x0, true) => self.assembly.end(),
            (0x3..=0x7 | 0xB..=0xF, _) => self.assembly.violated.store(true, Ordering::Relaxed),
            _ => {}
        }
        let payload = match self.header[1] & 0x7F {
            126 => u16::from_be_bytes([self.header[2], self.header[3]]) as u64,
            127 => u64::from_be_bytes(self.header[2..10].try_into().expect("8 bytes")),
            short => short as u64,
        };
        if matches!(opcode, 0x0..=0x2) && !self.assembly.is_logged_in() {
            self.count_pre_login(payload);
        }
        match payload {
            0 => Reading::Header { have: 0 },
            left => Reading::Payload { left },
        }
    }
}

/// The full length of a frame header whose first `bytes` are known, once that can be told.
fn header_len(bytes: &[u8]) -> Option<usize> {
    let second = *bytes.get(1)?;
    let mask = if second & 0x80 != 0 { 4 } else { 0 };
    let extended = match second & 0x7F {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    Some(2 + extended + mask)
}

impl<S: AsyncRead + Unpin> AsyncRead for FragmentWatch<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.stopped() {
                return Poll::Ready(Ok(())); // the end of the stream, as far as yawc knows
            }
            if let Some(acquiring) = this.acquiring.as_mut() {
                // The pool is never closed, so acquiring fails never.
                let permit = ready!(acquiring.as_mut().poll(cx)).expect("the pool stays open");
                this.assembly.reserve(permit);
                this.acquiring = None;
            }
            if this.held.is_empty() {
                break;
            }
            let take = this.held.len().min(buf.remaining());
            let held = std::mem::take(&mut this.held);
            let passed = this.observe(&held[..take]);
            buf.put_slice(&held[..passed]);
            this.held = held[passed..].to_vec();
            if passed > 0 {
                return Poll::Ready(Ok(()));
            }
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        let read = buf.filled().len() - before;
        let passed = this.observe(&buf.filled()[before..]);
        if passed < read {
            this.held = buf.filled()[before + passed..].to_vec();
            buf.set_filled(before + passed);
        }
        if this.stopped() {
            // Hold back everything from the offending frame on.
            buf.set_filled(before);
        }
        if read > 0 && buf.filled().len() == before && !this.stopped() {
            // Everything read waits for the pool: an empty read would look like the end.
            return Pin::new(this).poll_read(cx, buf);
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FragmentWatch<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![(fin as u8) << 7 | opcode];
        match payload.len() {
            n if n < 126 => out.push(0x80 | n as u8),
            n if n <= 0xFFFF => {
                out.push(0x80 | 126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                out.push(0x80 | 127);
                out.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        out.extend_from_slice(&[1, 2, 3, 4]);
        out.extend_from_slice(payload);
        out
    }

    fn watch() -> FragmentWatch<tokio::io::Empty> {
        FragmentWatch::new(tokio::io::empty(), test_assembly())
    }

    fn test_assembly() -> Arc<Assembly> {
        Assembly::new(Arc::new(Semaphore::new(1 << 20)))
    }

    fn unfinished(watch: &FragmentWatch<tokio::io::Empty>) -> bool {
        watch.assembly.started.load(Ordering::Relaxed) != 0
    }

    #[test]
    fn follows_fragmented_messages_across_any_split_of_the_bytes() {
        let mut bytes = b"GET / HTTP/1.1\r\nHost: q\r\nUpgrade: WebSocket\r\n\r\n".to_vec();
        bytes.extend(frame(true, 0x1, b"whole"));
        let started_at = bytes.len();
        bytes.extend(frame(false, 0x1, &[b'a'; 300]));
        bytes.extend(frame(true, 0x9, b"ping between fragments"));
        bytes.extend(frame(false, 0x0, b"middle"));
        bytes.extend(frame(true, 0xA, b""));
        bytes.extend(frame(false, 0x0, &[b'b'; 70_000]));
        let last_at = bytes.len();
        bytes.extend(frame(true, 0x0, b"end"));
        for chunk in [1, 2, 3, 5, 7, 13, 14, 15, 64, 4096, bytes.len()] {
            let mut w = watch();
            let mut seen_unfinished = false;
            for (at, piece) in bytes.chunks(chunk).enumerate() {
                w.observe(piece);
                let end = (at + 1) * chunk;
                if end > started_at + 2 && end < last_at {
                    seen_unfinished |= unfinished(&w);
                }
            }
            // In one read there is no moment between; in smaller ones there is.
            assert!(seen_unfinished || chunk == bytes.len(), "chunks of {chunk}");
            assert!(!unfinished(&w), "finished, chunks of {chunk}");
            assert!(!w.assembly.violated(), "chunks of {chunk}");
            assert_eq!(w.reading, Reading::Header { have: 0 }, "chunks of {chunk}");
        }
    }

    #[test]
    fn a_reserved_opcode_is_seen_across_any_split_of_the_bytes() {
        let mut bytes = b"GET / HTTP/1.1\r\nUpgrade: websocket\r\n\r\n".to_vec();
        bytes.extend(frame(true, 0x1, &[b'a'; 200]));
        bytes.extend(frame(true, 0x2, b""));
        // Seen once its whole header (2 bytes and the mask's 4) is.
        let reserved_seen_at = bytes.len() + 6;
        bytes.extend(frame(true, 0x3, b"reserved"));
        for chunk in [1, 2, 5, 6, 7, 64, bytes.len()] {
            let mut w = watch();
            for (at, piece) in bytes.chunks(chunk).enumerate() {
                w.observe(piece);
                let seen = (at + 1) * chunk;
                let violated = w.assembly.violated();
                assert_eq!(
                    violated,
                    seen >= reserved_seen_at,
                    "chunks of {chunk}, at {seen}"
                );
            }
        }
    }

    #[test]
    fn the_body_of_a_request_that_is_not_an_upgrade_is_no_frame() {
        let mut w = watch();
        w.observe(b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}");
        assert!(!w.assembly.violated(), "{{ is not a reserved opcode here");
    }

    #[tokio::test(start_paused = true)]
    async fn a_message_unfinished_past_the_limit_is_overdue() {
        let assembly = test_assembly();
        let limit = Duration::from_secs(30);
        let overdue = tokio::spawn({
            let assembly = assembly.clone();
            async move { assembly.overdue(limit).await }
        });
        assembly.begin();
        tokio::time::sleep(Duration::from_secs(10)).await;
        assembly.end();
        tokio::time::sleep(Duration::from_secs(25)).await;
        assert!(!overdue.is_finished(), "finished in time");
        assembly.begin();
        tokio::time::sleep(Duration::from_secs(31)).await;
        assert!(overdue.is_finished());
    }
}
