//! DNS over UDP. Each datagram is judged by its source's budget before anything is read from
//! it: within the budget it is answered in a task of its own, over it dropped or, one in
//! [`SLIP`](super::limits::SLIP), answered truncated at once. So a flood from one source costs
//! a lookup in the rate table per packet and leaves the others' queries answered.

use super::answer;
use super::limits::Verdict;
use super::tally::Limit;
use super::Service;
use hickory_server::net::xfer::Protocol;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use tokio::net::UdpSocket;
use tokio::sync::Semaphore;

/// UDP queries being answered at once. Past it a query within its budget is dropped, as a
/// full socket buffer would drop it, rather than queued: a flood from many (spoofed) sources,
/// each within its budget, cannot grow the tasks without bound.
const MAX_IN_FLIGHT: usize = 256;

/// The receive buffer asked of the kernel (which caps it at `net.core.rmem_max`): room for a
/// few thousand queries, so a burst from one source, read and dropped at our pace, does not
/// make the kernel drop another source's query first.
const RECEIVE_BUFFER: usize = 4 << 20;

/// The biggest datagram: a query bigger than the buffer would be cut and read as malformed.
const MAX_DATAGRAM: usize = u16::MAX as usize;

/// Answers the queries that arrive on `socket`, for as long as the process runs.
pub(super) async fn run(socket: UdpSocket, service: Arc<Service>) {
    let socket = Arc::new(socket);
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut buffer = vec![0; MAX_DATAGRAM];
    loop {
        let (length, src) = match socket.recv_from(&mut buffer).await {
            Ok(received) => received,
            Err(error) if unrecoverable(&error) => {
                tracing::error!(%error, "the DNS UDP socket stopped");
                return;
            }
            // An ICMP error from an earlier send, say: the socket goes on.
            Err(_) => continue,
        };
        if respondable(src) {
            let datagram = &buffer[..length];
            match service.udp_verdict(src.ip()) {
                Verdict::Answer => answer(&socket, &service, &in_flight, datagram, src),
                Verdict::Slip => slip(&socket, &service, datagram, src),
                Verdict::Drop => service.tally.hit(Limit::UdpDropped),
            }
        }
        // A flood keeps the socket readable: yield now and then, so the runtime's other tasks
        // (the API among them) still run.
        tokio::task::consume_budget().await;
    }
}

fn answer(
    socket: &Arc<UdpSocket>,
    service: &Arc<Service>,
    in_flight: &Arc<Semaphore>,
    datagram: &[u8],
    src: SocketAddr,
) {
    let Ok(permit) = in_flight.clone().try_acquire_owned() else {
        service.tally.hit(Limit::UdpBusy);
        return;
    };
    let (socket, service, query) = (socket.clone(), service.clone(), datagram.to_vec());
    tokio::spawn(async move {
        let answered = service.answerer.answer(query, src, Protocol::Udp).await;
        // One message at most: even a zone transfer's answer over UDP is one.
        for response in answered {
            // A send that fails loses one answer, as UDP may; the client asks again.
            let _ = socket.send_to(&response, src).await;
        }
        drop(permit);
    });
}

fn slip(socket: &UdpSocket, service: &Service, datagram: &[u8], src: SocketAddr) {
    service.tally.hit(Limit::UdpSlipped);
    if let Some(response) = answer::truncated(datagram) {
        // Never waits: with the send buffer full, a slip is as well dropped.
        let _ = socket.try_send_to(&response, src);
    }
}

/// Whether a response to `src` can go anywhere (hickory's server checks the same).
fn respondable(src: SocketAddr) -> bool {
    let unroutable = match src.ip() {
        IpAddr::V4(v4) => v4.is_unspecified() || v4.is_broadcast(),
        IpAddr::V6(v6) => v6.is_unspecified(),
    };
    src.port() != 0 && !unroutable
}

fn unrecoverable(error: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        error.kind(),
        ErrorKind::NotConnected | ErrorKind::ConnectionAborted
    )
}

/// Asks the kernel for [`RECEIVE_BUFFER`] bytes of receive buffer on `socket`.
pub(super) fn enlarge_receive_buffer(socket: &UdpSocket) -> std::io::Result<()> {
    socket2::SockRef::from(socket).set_recv_buffer_size(RECEIVE_BUFFER)
}
