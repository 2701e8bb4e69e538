//! Serves the API's router over a listener's connections (plain TCP, or `tls.rs`'s) with
//! hyper's HTTP/1.1 as `qe_serve` sets it up, and what `axum::serve` lacks: a connection
//! waiting for a request's head (a new one, or one kept alive after a response) is closed
//! unless the whole head arrives in time ([`HttpLimits`]), so a client that drips its headers, or
//! sits idle, holds nothing for long, with or without a token; a bounded number of
//! connections at once (past that, new ones wait in the kernel's backlog), each reading a
//! bounded buffer ahead; and on shutdown, connections have [`STOP_WITHIN`] to finish what they are
//! answering, so none can keep the process from stopping.

use crate::config::HttpLimits;
use axum::Router;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long open connections have on shutdown. A node's config watch is held for up to
/// `WATCH_HOLD_SECS`; it is told to close and asks again elsewhere, or of the next process.
const STOP_WITHIN: Duration = Duration::from_secs(5);

/// Answers requests on `listener`'s connections with `router`, within `limits`, until `stop`
/// completes.
pub async fn serve<L>(
    mut listener: L,
    router: Router,
    limits: HttpLimits,
    stop: impl Future<Output = ()>,
) where
    L: axum::serve::Listener<Addr = std::net::SocketAddr>,
{
    let limits = limits.serve_limits();
    let http = qe_serve::http1(&limits);
    let connections = GracefulShutdown::new();
    let places = Arc::new(Semaphore::new(limits.connections));
    tokio::pin!(stop);
    loop {
        let (place, (io, peer)) = tokio::select! {
            accepted = room_then_accept(&places, &mut listener) => accepted,
            () = &mut stop => break,
        };
        // Each request knows where it came from (the sign-in limit counts by source).
        let with_peer = tower::ServiceExt::map_request(
            router.clone(),
            move |mut request: axum::http::Request<hyper::body::Incoming>| {
                request
                    .extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                request
            },
        );
        let service = TowerToHyperService::new(with_peer);
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
