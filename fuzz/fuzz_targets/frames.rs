//! The bytes a client sends after its upgrade, as the node reads them: the watch beneath yawc
//! (fragmented messages, reserved opcodes, the pre-login frame budget) and yawc's frame and
//! fragment assembly with permessage-deflate, with the node's own options. Any bytes end in a
//! frame, an error or the end of the stream; none panics or hangs.

#![no_main]

use dataplane::admission::BIG_LOGIN_POOL_BYTES;
use dataplane::fragments::{Assembly, FragmentWatch};
use dataplane::server::websocket_options;
use libfuzzer_sys::fuzz_target;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::runtime::Runtime;
use tokio::sync::Semaphore;
use yawc::{Role, WebSocket};

/// The upgrade request hyper reads before the frames (the watch follows it too).
const UPGRADE: &[u8] =
    b"GET / HTTP/1.1\r\nHost: q\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
Sec-WebSocket-Extensions: permessage-deflate\r\n\r\n";

/// What the node agrees to with a client that offers permessage-deflate.
const AGREED: &str = "permessage-deflate; server_no_context_takeover; client_no_context_takeover";

/// A client's bytes to read, and a sink for what the node writes.
struct Client {
    input: std::io::Cursor<Vec<u8>>,
}

impl AsyncRead for Client {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.input).poll_read(cx, buf)
    }
}

impl AsyncWrite for Client {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    })
}

fuzz_target!(|data: &[u8]| {
    runtime().block_on(async {
        let mut input = UPGRADE.to_vec();
        input.extend_from_slice(data);
        let client = Client {
            input: std::io::Cursor::new(input),
        };
        let assembly = Assembly::new(Arc::new(Semaphore::new(BIG_LOGIN_POOL_BYTES)));
        let mut watch = FragmentWatch::new(client, assembly.clone());
        // hyper reads the request before it hands the stream over.
        let mut request = vec![0; UPGRADE.len()];
        if watch.read_exact(&mut request).await.is_err() {
            return;
        }
        let Ok(mut socket) = WebSocket::from_stream_with_extensions(
            watch,
            Role::Server,
            Some(AGREED),
            websocket_options(),
        ) else {
            return;
        };
        let mut frames = 0;
        while let Ok(frame) = socket.next_frame().await {
            frames += 1;
            if frames == 1 {
                // The first message is the login: what follows is read as logged in.
                assembly.logged_in();
            }
            std::hint::black_box(frame);
        }
    });
});
