//! A TCP gate in front of a server, on a loopback port of its own: open, it forwards every
//! connection; shut, nothing listens there (a connection is refused) and every connection
//! through it is cut, as when the server's host is down. Nodes can be given its address as
//! their control plane's (`node_url`) while the test talks to the control plane directly.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

pub struct Gate {
    /// Where it listens while open.
    pub addr: SocketAddr,
    /// Where it forwards to, once told.
    upstream: Arc<Mutex<Option<SocketAddr>>>,
    /// The accept loop and every connection's copy: aborted, all close.
    open: Option<tokio::task::JoinHandle<()>>,
}

impl Gate {
    /// A gate on a free loopback port, open, forwarding nowhere until [`Gate::forward_to`].
    pub async fn open_new() -> Gate {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let upstream = Arc::new(Mutex::new(None));
        let open = Some(tokio::spawn(forward(listener, upstream.clone())));
        Gate {
            addr,
            upstream,
            open,
        }
    }

    pub fn forward_to(&self, upstream: SocketAddr) {
        *self.upstream.lock().unwrap() = Some(upstream);
    }

    /// Stops listening and cuts every connection through it.
    pub fn shut(&mut self) {
        if let Some(open) = self.open.take() {
            open.abort();
        }
    }

    /// Listens again on the same port.
    pub async fn reopen(&mut self) {
        if self.open.is_none() {
            let listener = TcpListener::bind(self.addr).await.unwrap();
            self.open = Some(tokio::spawn(forward(listener, self.upstream.clone())));
        }
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.shut();
    }
}

/// Accepts on `listener` and copies both ways to the upstream; every copy is a task of the
/// set this owns, so aborting this cuts them all.
async fn forward(listener: TcpListener, upstream: Arc<Mutex<Option<SocketAddr>>>) {
    let mut copies = JoinSet::new();
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            continue;
        };
        let Some(to) = *upstream.lock().unwrap() else {
            continue;
        };
        copies.spawn(async move {
            if let Ok(mut outbound) = TcpStream::connect(to).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
        });
        while copies.try_join_next().is_some() {}
    }
}
