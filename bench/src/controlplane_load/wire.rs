//! The bytes the load test speaks, written by hand so an attacker can send what no client
//! library would: HTTP/1.1 requests and enough of a response reader for our API's answers, DNS
//! queries and answers (RFC 1035 §4.1), and throwaway random names.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// The longest response head read (our API's are a few hundred bytes).
const HEAD_AT_MOST: usize = 64 * 1024;

/// A TCP connection to `to` from the loopback address `from`: each kind of client has an
/// address of its own, so a server that limits by source can tell them apart.
pub async fn connect_from(from: Ipv4Addr, to: SocketAddr) -> io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind((from, 0).into())?;
    socket.connect(to).await
}

/// An HTTP/1.1 request head: `token` goes in `Authorization: Bearer`, a body is JSON of
/// `body_len` bytes; `close` asks for `Connection: close`.
pub fn request_head(
    method: &str,
    path: &str,
    token: Option<&str>,
    body_len: usize,
    close: bool,
) -> Vec<u8> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: cp\r\n");
    if let Some(token) = token {
        head += &format!("Authorization: Bearer {token}\r\n");
    }
    if body_len > 0 {
        head += &format!("Content-Type: application/json\r\nContent-Length: {body_len}\r\n");
    }
    if close {
        head += "Connection: close\r\n";
    }
    head += "\r\n";
    head.into_bytes()
}

/// A response as far as the load test reads it.
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
    /// Whether the connection may carry another request.
    pub reusable: bool,
}

/// Sends `head` and `body`, then reads one response.
pub async fn exchange(stream: &mut TcpStream, head: &[u8], body: &[u8]) -> io::Result<Response> {
    stream.write_all(head).await?;
    stream.write_all(body).await?;
    read_response(stream).await
}

/// One response: its body by its Content-Length, or to the end of the connection.
async fn read_response(stream: &mut TcpStream) -> io::Result<Response> {
    let mut buffer = Vec::new();
    let head_end = loop {
        if let Some(at) = find(&buffer, b"\r\n\r\n") {
            break at + 4;
        }
        if buffer.len() > HEAD_AT_MOST {
            return Err(invalid("a response head too long"));
        }
        read_more(stream, &mut buffer).await?;
    };
    let head = std::str::from_utf8(&buffer[..head_end]).map_err(|_| invalid("a head not UTF-8"))?;
    let status = status_of(head.as_bytes()).ok_or_else(|| invalid("no status line"))?;
    let length = header(head, "content-length").and_then(|value| value.parse::<usize>().ok());
    let close = header(head, "connection").is_some_and(|value| value.eq_ignore_ascii_case("close"));
    let mut body = buffer.split_off(head_end);
    match length {
        Some(length) => {
            while body.len() < length {
                read_more(stream, &mut body).await?;
            }
            body.truncate(length);
        }
        None => {
            stream.read_to_end(&mut body).await?;
        }
    }
    Ok(Response {
        status,
        body,
        reusable: length.is_some() && !close,
    })
}

/// Appends what the stream has; the end of the stream is an error (a response was due).
async fn read_more(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> io::Result<()> {
    buffer.reserve(16 * 1024);
    match stream.read_buf(buffer).await? {
        0 => Err(io::ErrorKind::UnexpectedEof.into()),
        _ => Ok(()),
    }
}

/// The status of a response that starts `HTTP/1.1 NNN`.
pub fn status_of(response: &[u8]) -> Option<u16> {
    let code = response.strip_prefix(b"HTTP/1.1 ")?.get(..3)?;
    std::str::from_utf8(code).ok()?.parse().ok()
}

/// The value of header `name` in a response head.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.eq_ignore_ascii_case(name).then_some(value.trim())
    })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// DNS record types the load test asks for.
pub const TYPE_A: u16 = 1;
pub const TYPE_SOA: u16 = 6;

/// A standard query for `name`'s `kind` records, without recursion (the server is the zone's
/// authority), in the class IN.
pub fn dns_query(id: u16, name: &str, kind: u16) -> Vec<u8> {
    let mut query = Vec::with_capacity(12 + name.len() + 6);
    query.extend_from_slice(&id.to_be_bytes());
    // Flags 0: a query, opcode QUERY, no recursion desired; one question, no records.
    query.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.trim_end_matches('.').split('.') {
        query.push(label.len() as u8);
        query.extend_from_slice(label.as_bytes());
    }
    query.push(0);
    query.extend_from_slice(&kind.to_be_bytes());
    query.extend_from_slice(&1u16.to_be_bytes());
    query
}

/// What the load test reads of a DNS answer: its header.
pub struct DnsAnswer {
    pub id: u16,
    pub rcode: u8,
    /// Records in the answer section.
    pub answers: u16,
}

/// The header of a DNS response (the QR bit set), or None for anything else.
pub fn dns_answer(message: &[u8]) -> Option<DnsAnswer> {
    if message.len() < 12 || message[2] & 0x80 == 0 {
        return None;
    }
    Some(DnsAnswer {
        id: u16::from_be_bytes([message[0], message[1]]),
        rcode: message[3] & 0x0f,
        answers: u16::from_be_bytes([message[6], message[7]]),
    })
}

/// A response code's name (RFC 1035 §4.1.1, RFC 2136 §2.2 for the rest).
pub fn rcode_name(rcode: u8) -> &'static str {
    match rcode {
        0 => "NOERROR",
        1 => "FORMERR",
        2 => "SERVFAIL",
        3 => "NXDOMAIN",
        4 => "NOTIMP",
        5 => "REFUSED",
        _ => "other rcode",
    }
}

/// Names that differ every time, so no cache or table entry serves two requests: xorshift64*,
/// seeded from the clock and the task (not a secret, only not repeating).
pub struct Rng(u64);

impl Rng {
    pub fn seeded(task: u64) -> Rng {
        let clock = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        Rng((clock ^ task.wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// `len` characters from `alphabet`.
    pub fn text(&mut self, alphabet: &[u8], len: usize) -> String {
        (0..len)
            .map(|_| alphabet[(self.next() % alphabet.len() as u64) as usize] as char)
            .collect()
    }

    /// A lowercase label of 12 letters and digits (the shape of a queue id).
    pub fn label(&mut self) -> String {
        self.text(b"abcdefghijklmnopqrstuvwxyz0123456789", 12)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dns_query_is_the_rfc_1035_layout() {
        let query = dns_query(0x1234, "q.test.example.", TYPE_SOA);
        let expected: &[u8] =
            b"\x12\x34\0\0\0\x01\0\0\0\0\0\0\x01q\x04test\x07example\0\0\x06\0\x01";
        assert_eq!(query, expected);
        assert!(dns_answer(&query).is_none(), "a query is no answer");
    }

    #[test]
    fn headers_are_found_whatever_their_case() {
        let head = "HTTP/1.1 401 Unauthorized\r\ncontent-length: 12\r\nConnection: close\r\n\r\n";
        assert_eq!(status_of(head.as_bytes()), Some(401));
        assert_eq!(header(head, "Content-Length"), Some("12"));
        assert_eq!(header(head, "connection"), Some("close"));
        assert_eq!(header(head, "date"), None);
    }
}
