//! Serves the API's router over a listener's connections (plain TCP, or `tls.rs`'s) with
//! hyper's HTTP/1.1, and what `axum::serve` lacks: a connection waiting for a request's head
//! (a new one, or one kept alive after a response) is closed unless the whole head arrives
//! within [`HEAD_WITHIN`], so a client that drips its headers, or sits idle, holds nothing for
//! long, with or without a token; and on shutdown, connections have [`STOP_WITHIN`] to finish
//! what they are answering, so none can keep the process from stopping.

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::time::Duration;

/// How long a connection may wait for a request's whole head (request line and headers),
/// counted from when the server starts waiting: generous for any real client, short for one
/// that sends a byte now and then. It is also how long a kept-alive connection may sit idle;
/// the nodes' clients drop theirs sooner (`dataplane/src/report.rs`), so they never send on
/// a connection being closed.
const HEAD_WITHIN: Duration = Duration::from_secs(20);

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
        .header_read_timeout(HEAD_WITHIN);
    let connections = GracefulShutdown::new();
    tokio::pin!(stop);
    loop {
        let (io, _peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut stop => break,
        };
        let service = TowerToHyperService::new(router.clone());
        let connection = connections.watch(http.serve_connection(TokioIo::new(io), service));
        // A connection that ends in an error (a head too slow, a client gone) ends only
        // itself.
        tokio::spawn(connection);
    }
    drop(listener);
    if tokio::time::timeout(STOP_WITHIN, connections.shutdown())
        .await
        .is_err()
    {
        tracing::info!("connections still open at shutdown were dropped");
    }
}
