//! The stream against tokio-rustls' client over a real loopback socket: data both ways at
//! every size a record splits, TLS 1.2 and 1.3, closes clean and unclean, bytes that are not
//! TLS; and that an idle stream holds no buffer.

use super::{accept, ServerStream};
use crate::Certificate;
use rustls::pki_types::ServerName;
use rustls::version::{TLS12, TLS13};
use std::io::ErrorKind;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// A self-signed certificate for `localhost`, served the node's way, and a client config for
/// `version` that trusts it.
fn configs(
    dir: &tempfile::TempDir,
    version: &'static rustls::SupportedProtocolVersion,
) -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    let cert = params.self_signed(&key).unwrap();
    let (cert_path, key_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    let server = Certificate::load(&cert_path, &key_path)
        .unwrap()
        .server_config()
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[version])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    (server, Arc::new(client))
}

/// A client and the server's stream for it, the handshake done on both sides.
async fn connected(
    version: &'static rustls::SupportedProtocolVersion,
) -> (
    TlsStream<TcpStream>,
    ServerStream<TcpStream>,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().unwrap();
    let (server_config, client_config) = configs(&dir, version);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        accept(server_config, tcp).await.unwrap()
    });
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let client = TlsConnector::from(client_config)
        .connect(name, tcp)
        .await
        .unwrap();
    (client, server.await.unwrap(), dir)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Reads `len` bytes from `server` through a reader buffer of `chunk` bytes.
async fn read_in_chunks(server: &mut ServerStream<TcpStream>, len: usize, chunk: usize) -> Vec<u8> {
    let mut got = Vec::with_capacity(len);
    let mut buffer = vec![0; chunk];
    while got.len() < len {
        let n = server.read(&mut buffer).await.unwrap();
        assert!(n > 0, "the stream ended after {} of {len} bytes", got.len());
        got.extend_from_slice(&buffer[..n]);
    }
    got
}

async fn holds_no_buffer(server: &ServerStream<TcpStream>) {
    assert_eq!(
        server.incoming.capacity(),
        0,
        "received bytes kept while idle"
    );
    assert_eq!(server.plaintext.capacity(), 0, "plaintext kept while idle");
    assert_eq!(server.outgoing.capacity(), 0, "TLS bytes kept while idle");
}

async fn both_ways_at_every_size(version: &'static rustls::SupportedProtocolVersion) {
    let (mut client, mut server, _dir) = connected(version).await;
    // Around a record's 2^14 bytes, and many records; read through a reader smaller than a
    // record and through one bigger than the socket's read.
    for (len, chunk) in [
        (1, 2048),
        (100, 7),
        (16_384, 2048),
        (16_385, 100),
        (300_000, 65_536),
    ] {
        let sent = pattern(len, len as u8);
        let writer = tokio::spawn(async move {
            client.write_all(&sent).await.unwrap();
            client.flush().await.unwrap();
            (client, sent)
        });
        let got = read_in_chunks(&mut server, len, chunk).await;
        let (returned, sent) = writer.await.unwrap();
        client = returned;
        assert!(got == sent, "{len} bytes to the server came out changed");
        holds_no_buffer(&server).await;

        let answer = pattern(len, 7);
        let reader = tokio::spawn(async move {
            let mut got = vec![0; len];
            client.read_exact(&mut got).await.unwrap();
            (client, got)
        });
        // Written in pieces, as yawc writes its frames, then flushed once.
        for piece in answer.chunks(5000) {
            server.write_all(piece).await.unwrap();
        }
        server.flush().await.unwrap();
        let (returned, got) = reader.await.unwrap();
        client = returned;
        assert!(got == answer, "{len} bytes to the client came out changed");
        holds_no_buffer(&server).await;
    }
    // A clean close from each side: the other reads the end of the stream.
    client.shutdown().await.unwrap();
    assert_eq!(server.read(&mut [0; 16]).await.unwrap(), 0);
    server.shutdown().await.unwrap();
    assert_eq!(client.read(&mut [0; 16]).await.unwrap(), 0);
}

#[tokio::test]
async fn data_goes_both_ways_whole_over_tls_1_3() {
    both_ways_at_every_size(&TLS13).await;
}

#[tokio::test]
async fn data_goes_both_ways_whole_over_tls_1_2() {
    both_ways_at_every_size(&TLS12).await;
}

#[tokio::test]
async fn a_socket_cut_without_close_notify_is_an_unexpected_end() {
    let (client, mut server, _dir) = connected(&TLS13).await;
    // The socket's end (a FIN), with no close_notify before it.
    let (mut tcp, _) = client.into_inner();
    tcp.shutdown().await.unwrap();
    let error = server.read(&mut [0; 16]).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::UnexpectedEof);
}

/// A plain socket that has sent `bytes` to a server's handshake, and how the handshake ended
/// (`None`: it did not fail).
async fn handshake_from(bytes: &[u8]) -> (TcpStream, tokio::task::JoinHandle<Option<ErrorKind>>) {
    let dir = tempfile::tempdir().unwrap();
    let (server_config, _) = configs(&dir, &TLS13);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let ended = accept(server_config, tcp)
            .await
            .err()
            .map(|error| error.kind());
        drop(dir);
        ended
    });
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(bytes).await.unwrap();
    (tcp, server)
}

#[tokio::test]
async fn bytes_that_are_not_tls_fail_the_handshake() {
    let (_tcp, server) = handshake_from(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n").await;
    assert_eq!(server.await.unwrap(), Some(ErrorKind::InvalidData));
}

#[tokio::test]
async fn a_client_of_an_old_protocol_is_told_why() {
    // A TLS 1.1 ClientHello (a record of version 3.1 offering only 3.2): the server answers
    // with an alert record (content type 21), not a bare close.
    let mut hello = vec![0x01, 0, 0, 0, 0x03, 0x02];
    hello.extend_from_slice(&[0x11; 32]); // random
    hello.extend_from_slice(&[0, 0, 2, 0x00, 0x2f, 1, 0]); // no session, one suite, null compression
    let length = (hello.len() - 4) as u32;
    hello[1..4].copy_from_slice(&length.to_be_bytes()[1..]);
    let mut record = vec![0x16, 0x03, 0x01];
    record.extend_from_slice(&(hello.len() as u16).to_be_bytes());
    record.extend_from_slice(&hello);
    let (mut tcp, server) = handshake_from(&record).await;
    let mut answer = [0; 7];
    tcp.read_exact(&mut answer).await.unwrap();
    assert_eq!(answer[0], 21, "an alert record");
    assert_eq!(answer[5], 2, "a fatal alert");
    assert!(server.await.unwrap().is_some(), "the handshake failed");
}

#[tokio::test]
async fn records_that_arrive_a_byte_at_a_time_are_put_together() {
    let exchange = byte_at_a_time_exchange();
    tokio::time::timeout(std::time::Duration::from_secs(60), exchange)
        .await
        .expect("the exchange ended, not stuck");
}

async fn byte_at_a_time_exchange() {
    // The server's reads bring one byte at a time: every record, and the handshake, arrives
    // in pieces, so each read keeps a part of a record for the next.
    let dir = tempfile::tempdir().unwrap();
    let (server_config, client_config) = configs(&dir, &TLS13);
    let (client_end, server_end) = tokio::io::duplex(64 << 10);
    let server = tokio::spawn(async move {
        let mut server = accept(server_config, OneByteReads(server_end))
            .await
            .unwrap();
        let mut got = vec![0; 20_000];
        server.read_exact(&mut got).await.unwrap();
        server.write_all(&got).await.unwrap();
        server.flush().await.unwrap();
        assert_eq!(
            server.incoming.capacity(),
            0,
            "received bytes kept while idle"
        );
        assert_eq!(server.outgoing.capacity(), 0, "TLS bytes kept while idle");
        got
    });
    let name = ServerName::try_from("localhost").unwrap();
    let mut client = TlsConnector::from(client_config)
        .connect(name, client_end)
        .await
        .unwrap();
    let sent = pattern(20_000, 3);
    client.write_all(&sent).await.unwrap();
    client.flush().await.unwrap();
    let mut echoed = vec![0; 20_000];
    client.read_exact(&mut echoed).await.unwrap();
    assert!(
        server.await.unwrap() == sent,
        "the server read something else"
    );
    assert!(echoed == sent, "the client read something else");
}

/// A stream whose reads bring at most one byte.
struct OneByteReads<S>(S);

impl<S: AsyncRead + Unpin> AsyncRead for OneByteReads<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let mut one = [0; 1];
        let mut limited = ReadBuf::new(&mut one);
        ready!(Pin::new(&mut self.0).poll_read(cx, &mut limited))?;
        buf.put_slice(limited.filled());
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for OneByteReads<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
