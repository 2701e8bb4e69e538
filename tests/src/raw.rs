//! A WebSocket client written out byte by byte, for what a library client will not do: send a
//! broken or unfinished frame, offer permessage-deflate, shrink its receive buffer, stop
//! reading, and read back exactly what reached its socket.

use crate::{login_request, Node, PROMPT};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// A masked client frame of any length.
pub fn client_frame(fin: bool, rsv1: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mask = [0x12, 0x34, 0x56, 0x78];
    let mut out = vec![((fin as u8) << 7) | ((rsv1 as u8) << 6) | opcode];
    match payload.len() {
        n if n < 126 => out.push(0x80 | n as u8),
        n if n <= u16::MAX as usize => {
            out.push(0x80 | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(0x80 | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    out
}

/// A message's payload compressed as permessage-deflate sends it (raw deflate, the final
/// empty block's `00 00 ff ff` left off); send it with RSV1 set.
pub fn deflated(payload: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder =
        flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(payload).unwrap();
    encoder.flush().unwrap();
    let mut out = encoder.finish().unwrap();
    // finish() adds an empty final block (03 00) after the sync flush's 00 00 ff ff.
    while out.ends_with(&[0x03, 0x00]) {
        out.truncate(out.len() - 2);
    }
    assert!(
        out.ends_with(&[0x00, 0x00, 0xff, 0xff]),
        "a sync-flushed stream"
    );
    out.truncate(out.len() - 4);
    out
}

/// How a raw connection is made.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Offer permessage-deflate.
    pub deflate: bool,
    /// The socket's receive buffer, in bytes (the kernel's default when `None`).
    pub receive_buffer: Option<u32>,
    /// The loopback address to connect from (127.0.0.1 when `None`): the node counts
    /// connections waiting for their login by source.
    pub source: Option<std::net::Ipv4Addr>,
}

/// Connects from `options.source`.
pub async fn connect(node: &Node, options: Options) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    if let Some(bytes) = options.receive_buffer {
        socket.set_recv_buffer_size(bytes).unwrap();
    }
    if let Some(source) = options.source {
        socket.bind((source, 0).into()).unwrap();
    }
    socket.connect(node.addr).await.unwrap()
}

/// Connects and upgrades; panics unless the node answers 101 (and agrees to deflate exactly
/// when it was offered).
pub async fn upgraded(node: &Node, options: Options) -> TcpStream {
    let mut tcp = connect(node, options).await;
    let extension = match options.deflate {
        true => "Sec-WebSocket-Extensions: permessage-deflate\r\n",
        false => "",
    };
    let handshake = format!(
        "GET / HTTP/1.1\r\nHost: q\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{extension}\r\n"
    );
    tcp.write_all(handshake.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    while !response.windows(4).any(|w| w == b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        tcp.read_exact(&mut byte).await.unwrap();
        response.push(byte[0]);
    }
    let response = String::from_utf8(response).unwrap().to_lowercase();
    assert!(response.starts_with("http/1.1 101"), "{response}");
    assert_eq!(
        response.contains("permessage-deflate"),
        options.deflate,
        "{response}"
    );
    tcp
}

/// Connects, upgrades and sends the login for `role` with `extra` fields; returns the socket
/// and the login's reply.
pub async fn logged_in(
    node: &Node,
    options: Options,
    role: &str,
    extra: Value,
) -> (TcpStream, Value) {
    let mut tcp = upgraded(node, options).await;
    let login = login_request(role, "distribute", extra).to_string();
    tcp.write_all(&client_frame(true, false, 0x1, login.as_bytes()))
        .await
        .unwrap();
    let (_, payload) = read_frame(&mut tcp).await;
    (tcp, serde_json::from_slice(&payload).unwrap())
}

/// Reads one frame from the node: (first byte, payload). Panics if none comes promptly.
pub async fn read_frame(tcp: &mut TcpStream) -> (u8, Vec<u8>) {
    let mut header = [0u8; 2];
    tokio::time::timeout(PROMPT, tcp.read_exact(&mut header))
        .await
        .expect("a frame in time")
        .unwrap();
    let len = match header[1] & 0x7F {
        126 => {
            let mut len = [0u8; 2];
            tcp.read_exact(&mut len).await.unwrap();
            u16::from_be_bytes(len) as usize
        }
        127 => {
            let mut len = [0u8; 8];
            tcp.read_exact(&mut len).await.unwrap();
            u64::from_be_bytes(len) as usize
        }
        short => short as usize,
    };
    let mut payload = vec![0u8; len];
    tcp.read_exact(&mut payload).await.unwrap();
    (header[0], payload)
}

/// The close code of the node's next frame, which must be a close frame.
pub async fn close_code(tcp: &mut TcpStream) -> u16 {
    let (first, payload) = read_frame(tcp).await;
    assert_eq!(first & 0x0F, 0x8, "a close frame");
    u16::from_be_bytes([payload[0], payload[1]])
}

/// Whether the node closes `tcp` with nothing (more) sent: the next read ends the stream.
pub async fn closed_with_nothing_sent(tcp: &mut TcpStream) -> bool {
    let mut buffer = [0u8; 64];
    let read = tokio::time::timeout(PROMPT, tcp.read(&mut buffer))
        .await
        .expect("the node closes it promptly");
    matches!(read, Ok(0) | Err(_))
}

/// Everything the node's side of `tcp` still sends, until it closes the connection.
pub async fn rest_of_stream(tcp: &mut TcpStream) -> Vec<u8> {
    let mut bytes = Vec::new();
    tokio::time::timeout(PROMPT, tcp.read_to_end(&mut bytes))
        .await
        .expect("the node closes the connection")
        .unwrap();
    bytes
}

/// The whole unmasked frames at the start of `bytes` (what a node sent), as (first byte,
/// payload); a frame cut off at the end is left out.
pub fn whole_frames(bytes: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut frames = Vec::new();
    let mut at = 0;
    while bytes.len() >= at + 2 {
        let (len, header) = match bytes[at + 1] & 0x7F {
            126 if bytes.len() >= at + 4 => (
                u16::from_be_bytes([bytes[at + 2], bytes[at + 3]]) as usize,
                4,
            ),
            127 if bytes.len() >= at + 10 => (
                u64::from_be_bytes(bytes[at + 2..at + 10].try_into().unwrap()) as usize,
                10,
            ),
            126 | 127 => break,
            short => (short as usize, 2),
        };
        let end = at + header + len;
        if end > bytes.len() {
            break;
        }
        frames.push((bytes[at], bytes[at + header..end].to_vec()));
        at = end;
    }
    frames
}
