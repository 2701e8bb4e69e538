//! Network bytes on the sockets, as billed: counted beneath HTTP, WebSocket and compression.

use std::io::IoSlice;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes every connection has sent and received since start.
#[derive(Debug, Default)]
pub struct Traffic {
    sent: AtomicU64,
    received: AtomicU64,
}

impl Traffic {
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }
}

/// Bytes one connection's socket has taken, so the connection can tell a client that reads
/// slowly from one that does not read at all.
#[derive(Debug, Clone, Default)]
pub struct SocketWrites(Arc<AtomicU64>);

impl SocketWrites {
    pub fn total(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    fn add(&self, bytes: usize) {
        self.0.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

/// A stream that adds what passes through it to a [`Traffic`], and what it writes to its
/// connection's [`SocketWrites`].
pub struct Counted<S> {
    inner: S,
    traffic: Arc<Traffic>,
    writes: SocketWrites,
}

impl<S> Counted<S> {
    /// Counts `inner`'s bytes into `traffic`; the handle counts its writes alone.
    pub fn new(inner: S, traffic: Arc<Traffic>) -> (Counted<S>, SocketWrites) {
        let writes = SocketWrites::default();
        let counted = Counted {
            inner,
            traffic,
            writes: writes.clone(),
        };
        (counted, writes)
    }

    fn wrote(&self, bytes: usize) {
        self.traffic.sent.fetch_add(bytes as u64, Ordering::Relaxed);
        self.writes.add(bytes);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let read = (buf.filled().len() - before) as u64;
            self.traffic.received.fetch_add(read, Ordering::Relaxed);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(written)) = polled {
            self.wrote(written);
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(written)) = polled {
            self.wrote(written);
        }
        polled
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
