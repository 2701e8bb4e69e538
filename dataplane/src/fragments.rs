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

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
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
}

impl Assembly {
    pub fn new() -> Arc<Assembly> {
        Arc::new(Assembly {
            started: AtomicU64::new(0),
            epoch: Instant::now(),
            began: Notify::new(),
            violated: AtomicBool::new(false),
        })
    }

    /// Whether the client broke the protocol in a way the watch stopped at.
    pub fn violated(&self) -> bool {
        self.violated.load(Ordering::Relaxed)
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

/// A stream whose incoming bytes are followed frame by frame.
pub struct FragmentWatch<S> {
    inner: S,
    assembly: Arc<Assembly>,
    reading: Reading,
    /// The header being read (at most 14 bytes).
    header: [u8; 14],
    /// The current HTTP request's bytes, lower-cased (the first few KiB).
    request: Vec<u8>,
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
        }
    }

    fn observe(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
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
                        4 if self.asks_for_websocket() => Reading::Header { have: 0 },
                        4 => {
                            self.request.clear();
                            Reading::Request { matched: 0 }
                        }
                        _ => Reading::Request { matched },
                    };
                }
                Reading::Header { have } => {
                    self.header[have] = bytes[0];
                    bytes = &bytes[1..];
                    let have = have + 1;
                    self.reading = match header_len(&self.header[..have]) {
                        Some(len) if len == have => self.header_done(),
                        _ => Reading::Header { have },
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
        if self.assembly.violated() {
            return Poll::Ready(Ok(())); // the end of the stream, as far as yawc knows
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let new = buf.filled()[before..].to_vec();
            self.observe(&new);
            if self.assembly.violated() {
                // Hold back everything from the offending frame on.
                buf.set_filled(before);
            }
        }
        polled
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
            n => {
                out.push(0x80 | 126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
        }
        out.extend_from_slice(&[1, 2, 3, 4]);
        out.extend_from_slice(payload);
        out
    }

    fn watch() -> FragmentWatch<tokio::io::Empty> {
        FragmentWatch::new(tokio::io::empty(), Assembly::new())
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
        let last_at = bytes.len();
        bytes.extend(frame(true, 0x0, b"end"));
        for chunk in [1, 2, 3, 7, 64, bytes.len()] {
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
        let assembly = Assembly::new();
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
