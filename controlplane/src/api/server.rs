//! Serves the API's router over a listener's connections (plain TCP, or `tls.rs`'s) with
//! hyper's HTTP/1.1, and what `axum::serve` lacks: a connection waiting for a request's head
//! (a new one, or one kept alive after a response) is closed unless the whole head arrives
//! within [`HEAD_WITHIN`], so a client that drips its headers, or sits idle, holds nothing for
//! long, with or without a token; at most [`CONNECTIONS_AT_MOST`] connections at once (past
//! that, new ones wait in the kernel's backlog), each reading at most [`READ_BUFFER_AT_MOST`]
//! ahead; and on shutdown, connections have [`STOP_WITHIN`] to finish what they are
//! answering, so none can keep the process from stopping.

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long a connection may wait for a request's whole head (request line and headers),
/// counted from when the server starts waiting: generous for any real client, short for one
/// that sends a byte now and then. It is also how long a kept-alive connection may sit idle;
/// the nodes' clients drop theirs sooner (`dataplane/src/report.rs`), so they never send on
/// a connection being closed.
const HEAD_WITHIN: Duration = Duration::from_secs(20);

/// Connections open at once: far more than the operator and the nodes need, and well under
/// the descriptors the process has, so the DNS and the nodes' reports still get theirs.
const CONNECTIONS_AT_MOST: usize = 4096;

/// How much of a connection's input is buffered at most (hyper's default is about 400 KiB):
/// a request head is far smaller, and bodies are read as they are taken.
const READ_BUFFER_AT_MOST: usize = 64 * 1024;

/// How long open connections have on shutdown. A node's config watch is held for up to
/// `WATCH_HOLD_SECS`; it is told to close and asks again elsewhere, or of the next process.
const STOP_WITHIN: Duration = Duration::from_secs(5);

/// Answers requests on `listener`'s connections with `router` until `stop` completes.
pub async fn serve<L>(mut listener: L, router: Router, stop: impl Future<Output = ()>)
where
    L: axum::serve::Listener,
{
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEAD_WITHIN)
        .max_buf_size(READ_BUFFER_AT_MOST);
    let connections = GracefulShutdown::new();
    let places = Arc::new(Semaphore::new(CONNECTIONS_AT_MOST));
    tokio::pin!(stop);
    loop {
        let (place, (io, _peer)) = tokio::select! {
            accepted = room_then_accept(&places, &mut listener) => accepted,
            () = &mut stop => break,
        };
        let service = TowerToHyperService::new(router.clone());
        let connection = connections.watch(http.serve_connection(TokioIo::new(io), service));
        // A connection that ends in an error (a head too slow, a client gone) ends only
        // itself, and gives its place back.
        tokio::spawn(async move {
            let _ = connection.await;
            drop(place);
        });
    }
    drop(listener);
    if tokio::time::timeout(STOP_WITHIN, connections.shutdown())
        .await
        .is_err()
    {
        tracing::info!("connections still open at shutdown were dropped");
    }
}

/// Waits for a place, then for a connection to take it.
async fn room_then_accept<L: axum::serve::Listener>(
    places: &Arc<Semaphore>,
    listener: &mut L,
) -> (OwnedSemaphorePermit, (L::Io, L::Addr)) {
    let place = places
        .clone()
        .acquire_owned()
        .await
        .expect("the semaphore is never closed");
    (place, listener.accept().await)
}
