//! A server's TLS stream that holds no buffer while its connection is idle.
//!
//! tokio-rustls keeps rustls' buffered connection, whose read buffer stays at 4 KiB from the
//! first read for as long as the connection is open: 4 KiB of every idle `wss://` connection,
//! a quarter of what one costs the node. This stream drives rustls' unbuffered connection
//! instead. What the socket gives is read into a buffer on the stack and decrypted from there;
//! only what must outlive the read is kept, each on the heap and freed once empty:
//!
//! - `incoming`: received bytes of a record not yet whole (or of a handshake);
//! - `plaintext`: decrypted bytes the reader had no room for;
//! - `outgoing`: TLS bytes the socket has not taken yet.

use rustls::server::{ServerConfig, UnbufferedServerConnection};
use rustls::unbuffered::{
    AppDataRecord, ConnectionState, EncodeError, EncryptError, InsufficientSizeError,
    UnbufferedStatus,
};
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes read from the socket at once: a whole record of the largest size (2^14 bytes of
/// plaintext, the most a cipher adds, the header).
const READ_BYTES: usize = (1 << 14) + 256 + 5;

/// Received bytes kept while they are not yet whole: rustls' own bound on a handshake flight
/// (64 KiB) and a read more. Past it the peer is sending something no TLS peer sends.
const MAX_INCOMING_BYTES: usize = (64 << 10) + READ_BYTES;

/// TLS bytes the socket has not taken, past which a write waits for the socket.
const MAX_UNSENT_BYTES: usize = 64 << 10;

/// The server side of a TLS connection over `io`, after its handshake: see [`accept`].
pub struct ServerStream<IO> {
    io: IO,
    tls: UnbufferedServerConnection,
    /// Received bytes not yet processed: the start of a record not yet whole.
    incoming: Vec<u8>,
    /// Decrypted bytes not yet read: `plaintext[plaintext_read..]`.
    plaintext: Vec<u8>,
    plaintext_read: usize,
    /// TLS bytes for the socket: `outgoing[outgoing_sent..]`.
    outgoing: Vec<u8>,
    outgoing_sent: usize,
    /// The peer closed (close_notify): reads see the end of the stream.
    peer_closed: bool,
    /// Our close_notify is queued.
    close_queued: bool,
}

/// Where the connection stands once rustls needs more received bytes to go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    /// The handshake is not finished.
    Handshaking,
    /// Application data may flow.
    Open,
    /// Both sides have closed.
    Closed,
}

/// What to do once the connection is open, while processing.
#[derive(Clone, Copy)]
enum Then<'d> {
    Nothing,
    Encrypt(&'d [u8]),
    CloseNotify,
}

/// Runs the server's side of the handshake over `io`.
pub async fn accept<IO>(config: Arc<ServerConfig>, io: IO) -> io::Result<ServerStream<IO>>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let tls = UnbufferedServerConnection::new(config).map_err(invalid_data)?;
    let mut stream = ServerStream {
        io,
        tls,
        incoming: Vec::new(),
        plaintext: Vec::new(),
        plaintext_read: 0,
        outgoing: Vec::new(),
        outgoing_sent: 0,
        peer_closed: false,
        close_queued: false,
    };
    std::future::poll_fn(|cx| stream.poll_handshake(cx)).await?;
    Ok(stream)
}

impl<IO: AsyncRead + AsyncWrite + Unpin> ServerStream<IO> {
    fn poll_handshake(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            let standing = match self.process_kept(&mut ReadBuf::new(&mut []), Then::Nothing) {
                Ok(standing) => standing,
                Err(error) => {
                    // The alert that says why (an old protocol, no common cipher), if the
                    // socket takes it now.
                    let _ = self.poll_send(cx);
                    return Poll::Ready(Err(error));
                }
            };
            match standing {
                // What rustls sends after the handshake (session tickets) goes out with the
                // first flush or read, not awaited here: a client that writes at once, before
                // it reads, would otherwise wait for the server as the server waits for it.
                Standing::Open => {
                    if let Poll::Ready(Err(error)) = self.poll_send(cx) {
                        return Poll::Ready(Err(error));
                    }
                    return Poll::Ready(Ok(()));
                }
                Standing::Closed => return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into())),
                Standing::Handshaking => {
                    // Each flight goes out before the peer's answer is awaited.
                    ready!(self.poll_send(cx))?;
                    let mut space = [MaybeUninit::<u8>::uninit(); READ_BYTES];
                    let mut received = ReadBuf::uninit(&mut space);
                    ready!(Pin::new(&mut self.io).poll_read(cx, &mut received))?;
                    if received.filled().is_empty() {
                        return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into()));
                    }
                    self.keep(received.filled())?;
                }
            }
        }
    }

    /// Processes received bytes `received` (none of them kept yet) as far as they go: their
    /// plaintext fills `out`, then `plaintext`; what is left of them is kept.
    fn absorb(&mut self, received: &mut [u8], out: &mut ReadBuf<'_>) -> io::Result<Standing> {
        if !self.incoming.is_empty() {
            self.keep(received)?;
            return self.process_kept(out, Then::Nothing);
        }
        let (processed, standing) = self.process(received, out, Then::Nothing)?;
        self.keep(&received[processed..])?;
        Ok(standing)
    }

    /// Processes the kept received bytes, and frees them once all are processed.
    fn process_kept(&mut self, out: &mut ReadBuf<'_>, then: Then) -> io::Result<Standing> {
        let mut incoming = std::mem::take(&mut self.incoming);
        let (processed, standing) = self.process(&mut incoming, out, then)?;
        if processed < incoming.len() {
            incoming.drain(..processed);
            self.incoming = incoming;
        }
        Ok(standing)
    }

    fn keep(&mut self, received: &[u8]) -> io::Result<()> {
        if self.incoming.len() + received.len() > MAX_INCOMING_BYTES {
            return Err(invalid_data(
                "more received than a TLS record or handshake holds",
            ));
        }
        self.incoming.extend_from_slice(received);
        Ok(())
    }

    /// Runs rustls over `received` until it needs more bytes: decrypted data fills `out` and
    /// then `plaintext`, TLS bytes to send are added to `outgoing`, and once the connection
    /// is open `then` is done. Returns how many of the bytes were processed.
    fn process(
        &mut self,
        received: &mut [u8],
        out: &mut ReadBuf<'_>,
        then: Then,
    ) -> io::Result<(usize, Standing)> {
        let mut processed = 0;
        loop {
            let UnbufferedStatus { mut discard, state } =
                self.tls.process_tls_records(&mut received[processed..]);
            let state = match state {
                Ok(state) => state,
                Err(error) => {
                    self.encode_alert();
                    return Err(invalid_data(error));
                }
            };
            let standing = match state {
                ConnectionState::ReadTraffic(mut traffic) => {
                    while let Some(record) = traffic.next_record() {
                        let AppDataRecord {
                            discard: more,
                            payload,
                        } = record.map_err(invalid_data)?;
                        discard += more;
                        let now = payload.len().min(out.remaining());
                        out.put_slice(&payload[..now]);
                        self.plaintext.extend_from_slice(&payload[now..]);
                    }
                    None
                }
                ConnectionState::EncodeTlsData(mut encode) => {
                    append(&mut self.outgoing, 0, |buffer| encode.encode(buffer))?;
                    None
                }
                // Sent by the next flush, in the order encoded.
                ConnectionState::TransmitTlsData(transmit) => {
                    transmit.done();
                    None
                }
                ConnectionState::BlockedHandshake => Some(Standing::Handshaking),
                ConnectionState::WriteTraffic(mut traffic) => {
                    match then {
                        Then::Nothing => {}
                        Then::Encrypt(data) => {
                            append(&mut self.outgoing, sealed(data), |buffer| {
                                traffic.encrypt(data, buffer)
                            })?
                        }
                        Then::CloseNotify => append(&mut self.outgoing, 64, |buffer| {
                            traffic.queue_close_notify(buffer)
                        })?,
                    }
                    Some(Standing::Open)
                }
                ConnectionState::PeerClosed => {
                    self.peer_closed = true;
                    None
                }
                ConnectionState::Closed => {
                    self.peer_closed = true;
                    Some(Standing::Closed)
                }
                // Early data is never accepted (the config's limit is 0).
                _ => return Err(invalid_data("a TLS state this server never enters")),
            };
            processed += discard;
            if let Some(standing) = standing {
                return Ok((processed, standing));
            }
        }
    }

    /// Adds the fatal alert rustls queued on an error to `outgoing` (after an error it still
    /// encodes what it queued, and nothing else).
    fn encode_alert(&mut self) {
        loop {
            match self.tls.process_tls_records(&mut []).state {
                Ok(ConnectionState::EncodeTlsData(mut encode)) => {
                    if append(&mut self.outgoing, 0, |buffer| encode.encode(buffer)).is_err() {
                        return;
                    }
                }
                Ok(ConnectionState::TransmitTlsData(transmit)) => transmit.done(),
                _ => return,
            }
        }
    }

    /// Moves decrypted bytes already kept into `out`; true if there were any.
    fn read_kept(&mut self, out: &mut ReadBuf<'_>) -> bool {
        let kept = &self.plaintext[self.plaintext_read..];
        if kept.is_empty() {
            return false;
        }
        let now = kept.len().min(out.remaining());
        out.put_slice(&kept[..now]);
        self.plaintext_read += now;
        if self.plaintext_read == self.plaintext.len() {
            self.plaintext = Vec::new();
            self.plaintext_read = 0;
        }
        true
    }

    /// Gives the socket every TLS byte waiting, then frees them.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.outgoing_sent < self.outgoing.len() {
            let unsent = &self.outgoing[self.outgoing_sent..];
            match ready!(Pin::new(&mut self.io).poll_write(cx, unsent))? {
                0 => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                sent => self.outgoing_sent += sent,
            }
        }
        self.outgoing = Vec::new();
        self.outgoing_sent = 0;
        Poll::Ready(Ok(()))
    }

    fn unsent(&self) -> usize {
        self.outgoing.len() - self.outgoing_sent
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for ServerStream<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if out.remaining() == 0 || this.read_kept(out) {
            return Poll::Ready(Ok(()));
        }
        let start = out.filled().len();
        while !this.peer_closed {
            // What reading made rustls send (a key update's answer, tickets) goes out now if
            // the socket takes it, else with the next flush.
            if this.unsent() > 0 {
                if let Poll::Ready(Err(error)) = this.poll_send(cx) {
                    return Poll::Ready(Err(error));
                }
            }
            let mut space = [MaybeUninit::<u8>::uninit(); READ_BYTES];
            let mut received = ReadBuf::uninit(&mut space);
            ready!(Pin::new(&mut this.io).poll_read(cx, &mut received))?;
            if received.filled().is_empty() {
                // The socket ended with no close_notify: the data may have been cut short.
                return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into()));
            }
            this.absorb(received.filled_mut(), out)?;
            if out.filled().len() > start {
                return Poll::Ready(Ok(()));
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for ServerStream<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.unsent() >= MAX_UNSENT_BYTES {
            ready!(this.poll_send(cx))?;
        }
        // Plaintext rustls still holds is kept, for the reads to come.
        match this.process_kept(&mut ReadBuf::new(&mut []), Then::Encrypt(data))? {
            Standing::Open => Poll::Ready(Ok(data.len())),
            Standing::Handshaking => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
            Standing::Closed => Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.close_queued {
            this.close_queued = true;
            this.process_kept(&mut ReadBuf::new(&mut []), Then::CloseNotify)?;
        }
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

/// Room for the TLS bytes `data` becomes in records: each of at most 2^14 bytes gets a
/// header (5), TLS 1.3's content type (1) and a tag (16), or TLS 1.2's explicit nonce (8) and
/// a tag; 16 more to spare.
fn sealed(data: &[u8]) -> usize {
    data.len() + data.len().div_ceil(1 << 14).max(1) * (5 + 1 + 16 + 16)
}

/// Appends what `write` writes to `outgoing`, given room for `expected` bytes first and the
/// room it asks for if that was too little.
fn append<E>(
    outgoing: &mut Vec<u8>,
    expected: usize,
    mut write: impl FnMut(&mut [u8]) -> Result<usize, E>,
) -> io::Result<()>
where
    E: TooSmall,
{
    let start = outgoing.len();
    outgoing.resize(start + expected, 0);
    let written = match write(&mut outgoing[start..]) {
        Ok(written) => written,
        Err(error) => {
            let required = error.required().ok_or_else(|| invalid_data(error))?;
            outgoing.resize(start + required, 0);
            write(&mut outgoing[start..]).map_err(invalid_data)?
        }
    };
    outgoing.truncate(start + written);
    Ok(())
}

/// rustls' errors for a buffer too small to write into.
trait TooSmall: std::error::Error + Send + Sync + 'static {
    /// The room asked for, if that is the error.
    fn required(&self) -> Option<usize>;
}

impl TooSmall for EncodeError {
    fn required(&self) -> Option<usize> {
        match self {
            EncodeError::InsufficientSize(InsufficientSizeError { required_size }) => {
                Some(*required_size)
            }
            _ => None,
        }
    }
}

impl TooSmall for EncryptError {
    fn required(&self) -> Option<usize> {
        match self {
            EncryptError::InsufficientSize(InsufficientSizeError { required_size }) => {
                Some(*required_size)
            }
            _ => None,
        }
    }
}

fn invalid_data(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error)
}

#[cfg(test)]
mod tests;
