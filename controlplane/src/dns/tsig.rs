//! TSIG (RFC 8945) with HMAC-SHA256: a key shared with the outside secondaries signs what
//! passes between us, so a zone transfer goes only to a holder of the key (not just to an
//! address in `dns_transfer_allow`) and a secondary acts only on our NOTIFY.
//!
//! Done on the message's bytes, beside hickory rather than through it: hickory's TSIG code
//! (behind dnssec features we do not build) signs one response, while a transfer's messages
//! each carry a MAC chained to the one before (RFC 8945 §5.3.1), and its catalog takes no
//! keys. So a signed request has its TSIG checked and cut off here, the rest is answered as
//! any query is, and each response is signed on its way out:
//!
//! - the first response's MAC covers the request's MAC, the response and the TSIG variables;
//! - each later message of a transfer covers the MAC before it, the message and the timers;
//! - a request whose key we lack, or whose MAC is wrong, gets NOTAUTH with an unsigned TSIG
//!   saying BADKEY or BADSIG; one signed too far from our clock gets BADTIME, signed, with our
//!   time (§5.2.3).
//!
//! Every message of a transfer is signed (§5.3.1 allows up to 99 unsigned in between; Knot and
//! BIND take either).

use qe_shared::hmac::hmac_sha256;
use subtle::ConstantTimeEq;

/// The TSIG record's type.
const TSIG: u16 = 250;
/// Its class: ANY.
const ANY: u16 = 255;
/// `hmac-sha256.` in wire form, the only algorithm we take.
const HMAC_SHA256: &[u8] = b"\x0bhmac-sha256\x00";
/// How far a signature's time may be from our clock, in seconds (RFC 8945 §10's advice).
const FUDGE: u16 = 300;
/// A DNS message's header, in bytes.
const HEADER: usize = 12;
/// NOTAUTH: the response code of a TSIG that does not check out.
const NOTAUTH: u8 = 9;

/// The TSIG errors we send (RFC 8945 §4.3), by the RFC's names.
#[allow(clippy::enum_variant_names)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TsigError {
    BadSig = 16,
    BadKey = 17,
    BadTime = 18,
}

/// A key shared with the secondaries: its name and its secret.
#[derive(Clone)]
pub struct TsigKey {
    /// The key's name in wire form, lower case: how it is compared and signed.
    name: Vec<u8>,
    secret: Vec<u8>,
}

impl std::fmt::Debug for TsigKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        write!(f, "TsigKey({})", text_of(&self.name))
    }
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TsigKeyError {
    #[error("{0:?} is not a DNS name for a TSIG key")]
    Name(String),
    #[error("the TSIG secret is not base64 (as `keymgr -t NAME hmac-sha256` or `tsig-keygen` prints it)")]
    Base64,
    #[error("the TSIG secret has {0} bytes: HMAC-SHA256 wants at least 16 (32 is usual)")]
    Short(usize),
}

impl TsigKey {
    /// The key `name` (`transfer.example.net`) with `secret` in base64, as Knot's `keymgr -t`
    /// and BIND's `tsig-keygen` print it.
    pub fn new(name: &str, secret: &str) -> Result<TsigKey, TsigKeyError> {
        use base64::Engine;
        let secret = base64::engine::general_purpose::STANDARD
            .decode(secret.trim())
            .map_err(|_| TsigKeyError::Base64)?;
        // RFC 8945 §6: at least half the hash's length.
        if secret.len() < 16 {
            return Err(TsigKeyError::Short(secret.len()));
        }
        let name = wire_name(name).ok_or_else(|| TsigKeyError::Name(name.into()))?;
        Ok(TsigKey { name, secret })
    }

    fn mac(&self, data: &[u8]) -> [u8; 32] {
        hmac_sha256(&self.secret, data)
    }
}

/// What a request's TSIG says about it.
pub(super) enum Checked {
    /// No TSIG: the request as it came.
    Unsigned(Vec<u8>),
    /// Signed with our key: the request without its TSIG, for the answer, and the signer of
    /// the responses.
    Signed(Vec<u8>, Signer),
    /// A TSIG that does not check out: the response to send, and nothing else.
    Refused(Vec<u8>),
    /// Not a message we can read as one with a TSIG at its end: answered as any unreadable
    /// query is.
    Unreadable,
}

/// Checks the TSIG at the end of the request `raw` (if it has one) against `key`, at `now`
/// (seconds since 1970).
pub(super) fn check(raw: Vec<u8>, key: &TsigKey, now: u64) -> Checked {
    let found = match find(&raw) {
        Ok(Some(found)) => found,
        Ok(None) => return Checked::Unsigned(raw),
        Err(Unreadable) => return Checked::Unreadable,
    };
    let refuse = |error, mac: &[u8]| Checked::Refused(refusal(&raw, &found, key, error, mac, now));
    if found.key_name != key.name || found.algorithm != HMAC_SHA256 {
        return refuse(TsigError::BadKey, &[]);
    }
    let mut signed = Vec::with_capacity(found.start + 64);
    signed.extend_from_slice(&unsigned_part(&raw, &found));
    variables(&mut signed, key, &found.fields);
    let expected = key.mac(&signed);
    // A MAC cut short is not one we take (RFC 8945 §5.2.2.1 allows it; no secondary sends it).
    if found.mac.len() != expected.len() || !bool::from(found.mac.ct_eq(&expected)) {
        return refuse(TsigError::BadSig, &[]);
    }
    if now.abs_diff(found.fields.time) > allowed_skew(&found.fields) {
        let mac = found.mac.to_vec();
        return refuse(TsigError::BadTime, &mac);
    }
    let request = unsigned_part(&raw, &found);
    let signer = Signer::new(key.clone(), found.mac.to_vec(), now);
    Checked::Signed(request, signer)
}

/// Signs responses in order: the first against the request's MAC, each after against the one
/// before it.
pub(super) struct Signer {
    key: TsigKey,
    /// The MAC the next message's covers: the request's, then each response's.
    prior_mac: Vec<u8>,
    /// Whether a response has been signed: the first covers all the TSIG variables, the later
    /// ones the timers alone.
    signed_one: bool,
    time: u64,
}

impl Signer {
    fn new(key: TsigKey, request_mac: Vec<u8>, now: u64) -> Signer {
        Signer {
            key,
            prior_mac: request_mac,
            signed_one: false,
            time: now,
        }
    }

    /// Appends a TSIG to the response `message` (it must have none).
    pub(super) fn sign(&mut self, message: &mut Vec<u8>) {
        let fields = Fields::ours(self.time, 0, Vec::new());
        let mut data = Vec::with_capacity(message.len() + 128);
        data.extend_from_slice(&(self.prior_mac.len() as u16).to_be_bytes());
        data.extend_from_slice(&self.prior_mac);
        data.extend_from_slice(message);
        if self.signed_one {
            timers(&mut data, &fields);
        } else {
            variables(&mut data, &self.key, &fields);
        }
        let mac = self.key.mac(&data);
        append(message, &self.key.name, &fields, &mac);
        self.prior_mac = mac.to_vec();
        self.signed_one = true;
    }
}

/// Signs the request `message` (a NOTIFY) with `key` at `now`; returns its MAC, which the
/// response's covers.
pub(super) fn sign_request(message: &mut Vec<u8>, key: &TsigKey, now: u64) -> Vec<u8> {
    let fields = Fields::ours(now, 0, Vec::new());
    let mut data = message.clone();
    variables(&mut data, key, &fields);
    let mac = key.mac(&data);
    append(message, &key.name, &fields, &mac);
    mac.to_vec()
}

/// Whether `raw`, a response to a request signed with `request_mac`, is signed with `key`
/// within the fudge of `now` and carries no TSIG error.
pub(super) fn verify_response(raw: &[u8], key: &TsigKey, request_mac: &[u8], now: u64) -> bool {
    let Ok(Some(found)) = find(raw) else {
        return false;
    };
    if found.key_name != key.name || found.algorithm != HMAC_SHA256 || found.fields.error != 0 {
        return false;
    }
    let mut data = Vec::with_capacity(raw.len() + 64);
    data.extend_from_slice(&(request_mac.len() as u16).to_be_bytes());
    data.extend_from_slice(request_mac);
    data.extend_from_slice(&unsigned_part(raw, &found));
    variables(&mut data, key, &found.fields);
    let expected = key.mac(&data);
    let mac_matches = found.mac.len() == expected.len() && bool::from(found.mac.ct_eq(&expected));
    mac_matches && now.abs_diff(found.fields.time) <= allowed_skew(&found.fields)
}

/// How far from our clock a signature may be: the signer's fudge, but never more than ours,
/// so that a captured request cannot be replayed for the 18 hours a fudge of 65535 would give.
fn allowed_skew(fields: &Fields) -> u64 {
    u64::from(fields.fudge.min(FUDGE))
}

/// The TSIG variables after the MAC (RFC 8945 §4.2): the same in a request and a response.
struct Fields {
    /// Seconds since 1970, 48 bits.
    time: u64,
    fudge: u16,
    original_id: Option<u16>,
    error: u16,
    other: Vec<u8>,
}

impl Fields {
    fn ours(time: u64, error: u16, other: Vec<u8>) -> Fields {
        Fields {
            time,
            fudge: FUDGE,
            original_id: None,
            error,
            other,
        }
    }
}

/// A TSIG found at the end of a message.
struct Found<'a> {
    /// Where the TSIG record starts: the message before it is what was signed.
    start: usize,
    key_name: Vec<u8>,
    algorithm: Vec<u8>,
    mac: &'a [u8],
    fields: Fields,
}

/// A message that ends before its header says it does, or whose names do not read.
#[derive(Debug)]
struct Unreadable;

/// The TSIG record that ends `raw`'s additional section, if there is one.
fn find(raw: &[u8]) -> Result<Option<Found<'_>>, Unreadable> {
    let count = |at: usize| Some(u16::from_be_bytes(raw.get(at..at + 2)?.try_into().ok()?));
    let counts = [4, 6, 8, 10].map(count);
    let [Some(questions), Some(answers), Some(authorities), Some(additionals)] = counts else {
        return Err(Unreadable);
    };
    if additionals == 0 {
        return Ok(None);
    }
    let mut at = HEADER;
    for _ in 0..questions {
        at = read_name(raw, at).ok_or(Unreadable)?.1 + 4;
    }
    let records = u32::from(answers) + u32::from(authorities) + u32::from(additionals);
    let mut last = at;
    for _ in 0..records {
        last = at;
        let (_, after_name) = read_name(raw, at).ok_or(Unreadable)?;
        let length = usize::from(read_u16(raw, after_name + 8).ok_or(Unreadable)?);
        at = after_name + 10 + length;
    }
    if at != raw.len() {
        return Err(Unreadable);
    }
    let (key_name, after_name) = read_name(raw, last).ok_or(Unreadable)?;
    if read_u16(raw, after_name) != Some(TSIG) {
        return Ok(None);
    }
    let rdata = after_name + 10;
    let found = read_rdata(raw, rdata).ok_or(Unreadable)?;
    let (algorithm, mac, fields) = found;
    Ok(Some(Found {
        start: last,
        key_name,
        algorithm,
        mac,
        fields,
    }))
}

/// A TSIG's RDATA at `at`: the algorithm's name, the MAC, the rest.
fn read_rdata(raw: &[u8], at: usize) -> Option<(Vec<u8>, &[u8], Fields)> {
    let (algorithm, at) = read_name(raw, at)?;
    let time = raw.get(at..at + 6)?;
    let time = time
        .iter()
        .fold(0u64, |sum, byte| sum << 8 | u64::from(*byte));
    let fudge = read_u16(raw, at + 6)?;
    let mac_length = usize::from(read_u16(raw, at + 8)?);
    let mac = raw.get(at + 10..at + 10 + mac_length)?;
    let at = at + 10 + mac_length;
    let original_id = read_u16(raw, at)?;
    let error = read_u16(raw, at + 2)?;
    let other_length = usize::from(read_u16(raw, at + 4)?);
    let other = raw.get(at + 6..at + 6 + other_length)?.to_vec();
    let fields = Fields {
        time,
        fudge,
        original_id: Some(original_id),
        error,
        other,
    };
    Some((algorithm, mac, fields))
}

fn read_u16(raw: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(raw.get(at..at + 2)?.try_into().ok()?))
}

/// The name at `at` in wire form, lower case, pointers followed; and where what follows it
/// starts.
fn read_name(raw: &[u8], mut at: usize) -> Option<(Vec<u8>, usize)> {
    let mut name = Vec::new();
    let mut end = None;
    // A name is at most 255 bytes, so at most 127 labels: more jumps than that loop.
    for _ in 0..128 {
        let length = *raw.get(at)?;
        match length & 0xC0 {
            0xC0 => {
                let pointer = usize::from(read_u16(raw, at)? & 0x3FFF);
                end.get_or_insert(at + 2);
                at = pointer;
            }
            0 if length == 0 => {
                name.push(0);
                return (name.len() <= 255).then(|| (name, end.unwrap_or(at + 1)));
            }
            0 => {
                let label = raw.get(at + 1..at + 1 + usize::from(length))?;
                name.push(length);
                name.extend(label.iter().map(u8::to_ascii_lowercase));
                at += 1 + usize::from(length);
            }
            _ => return None,
        }
    }
    None
}

/// `name` (`transfer.example.net`, with or without the final dot) in wire form, lower case.
fn wire_name(name: &str) -> Option<Vec<u8>> {
    let name = name.strip_suffix('.').unwrap_or(name);
    let mut wire = Vec::with_capacity(name.len() + 2);
    for label in name.split('.') {
        let fits = !label.is_empty() && label.len() < 64;
        if !fits
            || !label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return None;
        }
        wire.push(label.len() as u8);
        wire.extend(label.bytes().map(|b| b.to_ascii_lowercase()));
    }
    wire.push(0);
    (wire.len() <= 255).then_some(wire)
}

/// A name in wire form as text, for logs.
fn text_of(wire: &[u8]) -> String {
    let mut labels = Vec::new();
    let mut at = 0;
    while let Some(&length) = wire.get(at).filter(|length| **length != 0) {
        let label = &wire[at + 1..at + 1 + usize::from(length)];
        labels.push(String::from_utf8_lossy(label).into_owned());
        at += 1 + usize::from(length);
    }
    labels.join(".") + "."
}

/// The message as it was before its TSIG was added: the TSIG cut off, one fewer additional
/// record, and the ID it was signed with.
fn unsigned_part(raw: &[u8], found: &Found) -> Vec<u8> {
    let mut message = raw[..found.start].to_vec();
    let additionals = u16::from_be_bytes([message[10], message[11]]) - 1;
    message[10..12].copy_from_slice(&additionals.to_be_bytes());
    if let Some(id) = found.fields.original_id {
        message[0..2].copy_from_slice(&id.to_be_bytes());
    }
    message
}

/// The TSIG variables a request's or first response's MAC covers (RFC 8945 §4.3.3).
fn variables(data: &mut Vec<u8>, key: &TsigKey, fields: &Fields) {
    data.extend_from_slice(&key.name);
    data.extend_from_slice(&ANY.to_be_bytes());
    data.extend_from_slice(&0u32.to_be_bytes());
    data.extend_from_slice(HMAC_SHA256);
    timers(data, fields);
    data.extend_from_slice(&fields.error.to_be_bytes());
    data.extend_from_slice(&(fields.other.len() as u16).to_be_bytes());
    data.extend_from_slice(&fields.other);
}

/// The timers: what a later message of a transfer covers beside the message (§5.3.1).
fn timers(data: &mut Vec<u8>, fields: &Fields) {
    data.extend_from_slice(&fields.time.to_be_bytes()[2..]);
    data.extend_from_slice(&fields.fudge.to_be_bytes());
}

/// Appends the TSIG record with `mac` to `message` and counts it in the header.
fn append(message: &mut Vec<u8>, key_name: &[u8], fields: &Fields, mac: &[u8]) {
    let id = [message[0], message[1]];
    let mut rdata = Vec::with_capacity(64 + fields.other.len());
    rdata.extend_from_slice(HMAC_SHA256);
    timers(&mut rdata, fields);
    rdata.extend_from_slice(&(mac.len() as u16).to_be_bytes());
    rdata.extend_from_slice(mac);
    rdata.extend_from_slice(&id);
    rdata.extend_from_slice(&fields.error.to_be_bytes());
    rdata.extend_from_slice(&(fields.other.len() as u16).to_be_bytes());
    rdata.extend_from_slice(&fields.other);

    message.extend_from_slice(key_name);
    message.extend_from_slice(&TSIG.to_be_bytes());
    message.extend_from_slice(&ANY.to_be_bytes());
    message.extend_from_slice(&0u32.to_be_bytes());
    message.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
    message.extend_from_slice(&rdata);
    let additionals = u16::from_be_bytes([message[10], message[11]]) + 1;
    message[10..12].copy_from_slice(&additionals.to_be_bytes());
}

/// NOTAUTH for the request `raw` whose TSIG `found` did not check out: its header and
/// question, and a TSIG saying why (RFC 8945 §5.3.2). Unsigned, but for BADTIME, which is
/// signed against the request's `mac` and carries our time.
fn refusal(
    raw: &[u8],
    found: &Found,
    key: &TsigKey,
    error: TsigError,
    mac: &[u8],
    now: u64,
) -> Vec<u8> {
    let questions_end = question_end(raw).unwrap_or(HEADER).min(found.start);
    let mut response = raw[..questions_end].to_vec();
    // QR, the request's opcode and RD; NOTAUTH.
    response[2] = 0x80 | (raw[2] & 0x79);
    response[3] = NOTAUTH;
    let questions = if questions_end > HEADER { raw[5] } else { 0 };
    response[4..12].copy_from_slice(&[0, questions, 0, 0, 0, 0, 0, 0]);
    if error == TsigError::BadTime {
        let other = now.to_be_bytes()[2..].to_vec();
        let fields = Fields::ours(found.fields.time, error as u16, other);
        let mut data = Vec::with_capacity(response.len() + 128);
        data.extend_from_slice(&(mac.len() as u16).to_be_bytes());
        data.extend_from_slice(mac);
        data.extend_from_slice(&response);
        variables(&mut data, key, &fields);
        let mac = key.mac(&data);
        append(&mut response, &key.name, &fields, &mac);
    } else {
        // Named as the request named it, which may not be a key of ours.
        let fields = Fields::ours(found.fields.time, error as u16, Vec::new());
        append(&mut response, &found.key_name, &fields, &[]);
    }
    response
}

/// Where the question section of `raw` ends.
fn question_end(raw: &[u8]) -> Option<usize> {
    let mut at = HEADER;
    for _ in 0..read_u16(raw, 4)? {
        at = read_name(raw, at)?.1 + 4;
    }
    (at <= raw.len()).then_some(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_server::proto::op::{Message, Query, ResponseCode};
    use hickory_server::proto::rr::{Name, RecordType};
    use std::str::FromStr;

    const SECRET: &str = "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LTMyYg==";
    const NOW: u64 = 1_795_000_000;

    fn key() -> TsigKey {
        TsigKey::new("Transfer.Example.NET.", SECRET).unwrap()
    }

    fn axfr() -> Vec<u8> {
        let mut query = Message::query();
        query.metadata.id = 4242;
        let name = Name::from_str("q.c.example.test.").unwrap();
        query.add_query(Query::query(name, RecordType::AXFR));
        query.to_vec().unwrap()
    }

    /// A request signed as a secondary signs it, at `time` with `key`.
    fn signed(key: &TsigKey, time: u64) -> (Vec<u8>, Vec<u8>) {
        let mut request = axfr();
        let mac = sign_request(&mut request, key, time);
        (request, mac)
    }

    fn refused_with(checked: Checked) -> (ResponseCode, u16, usize) {
        let Checked::Refused(response) = checked else {
            panic!("refused");
        };
        let found = find(&response).ok().flatten().expect("a TSIG");
        let message = Message::from_vec(&response).unwrap();
        assert_eq!(message.metadata.id, 4242);
        assert_eq!(message.queries.len(), 1, "the question kept");
        (
            message.metadata.response_code,
            found.fields.error,
            found.mac.len(),
        )
    }

    #[test]
    fn a_request_signed_with_our_key_passes_without_its_tsig_and_its_answer_verifies() {
        let (request, request_mac) = signed(&key(), NOW);
        let Checked::Signed(stripped, mut signer) = check(request, &key(), NOW + 10) else {
            panic!("signed");
        };
        assert_eq!(stripped, axfr(), "the request as before it was signed");
        let mut response = Message::from_vec(&axfr()).unwrap();
        response.metadata.message_type = hickory_server::proto::op::MessageType::Response;
        let mut first = response.to_vec().unwrap();
        signer.sign(&mut first);
        assert!(verify_response(&first, &key(), &request_mac, NOW));
        assert!(Message::from_vec(&first).is_ok(), "a message hickory reads");
        // Not against another request's MAC, nor with a byte changed.
        assert!(!verify_response(&first, &key(), &[0; 32], NOW));
        let mut altered = first.clone();
        altered[3] ^= 1;
        assert!(!verify_response(&altered, &key(), &request_mac, NOW));
    }

    #[test]
    fn a_later_message_is_signed_against_the_one_before_over_the_timers_only() {
        let (request, _) = signed(&key(), NOW);
        let Checked::Signed(_, mut signer) = check(request, &key(), NOW) else {
            panic!("signed");
        };
        let mut first = axfr();
        signer.sign(&mut first);
        let first_mac = find(&first).unwrap().unwrap().mac.to_vec();
        let mut second = axfr();
        signer.sign(&mut second);
        let found = find(&second).unwrap().unwrap();
        let mut data = 32u16.to_be_bytes().to_vec();
        data.extend_from_slice(&first_mac);
        data.extend_from_slice(&axfr());
        data.extend_from_slice(&NOW.to_be_bytes()[2..]);
        data.extend_from_slice(&FUDGE.to_be_bytes());
        assert_eq!(found.mac, key().mac(&data));
    }

    #[test]
    fn a_wrong_key_a_wrong_mac_and_a_far_time_get_notauth_saying_why() {
        let other = TsigKey::new("other.example.net", SECRET).unwrap();
        let (request, _) = signed(&other, NOW);
        let (code, error, mac) = refused_with(check(request, &key(), NOW));
        assert_eq!((code, error, mac), (ResponseCode::NotAuth, 17, 0));

        let same_name_other_secret =
            TsigKey::new("transfer.example.net", "b3RoZXItb3RoZXItb3RoZXItMzI=").unwrap();
        let (request, _) = signed(&same_name_other_secret, NOW);
        let (code, error, mac) = refused_with(check(request, &key(), NOW));
        assert_eq!((code, error, mac), (ResponseCode::NotAuth, 16, 0));

        let (mut request, _) = signed(&key(), NOW);
        request[13] ^= 0x20; // the question's name, changed after signing
        let (_, error, _) = refused_with(check(request, &key(), NOW));
        assert_eq!(error, 16);

        let (request, request_mac) = signed(&key(), NOW - 301);
        let Checked::Refused(late) = check(request, &key(), NOW) else {
            panic!("refused");
        };
        let found = find(&late).unwrap().unwrap();
        assert_eq!(found.fields.error, 18);
        assert_eq!(found.fields.other, NOW.to_be_bytes()[2..], "our time");
        assert_eq!(found.mac.len(), 32, "BADTIME is signed");
        // Signed against the request: check it as a secondary would, error and all.
        let mut data = 32u16.to_be_bytes().to_vec();
        data.extend_from_slice(&request_mac);
        data.extend_from_slice(&unsigned_part(&late, &found));
        variables(&mut data, &key(), &found.fields);
        assert_eq!(found.mac, key().mac(&data));
    }

    #[test]
    fn a_signers_wide_fudge_does_not_stretch_ours() {
        // Signed 1,000 s ago with a fudge of 65535: within theirs, past ours (300).
        let fields = Fields {
            fudge: u16::MAX,
            ..Fields::ours(NOW - 1000, 0, Vec::new())
        };
        let mut request = axfr();
        let mut data = request.clone();
        variables(&mut data, &key(), &fields);
        append(&mut request, &key().name, &fields, &key().mac(&data));
        let (_, error, _) = refused_with(check(request, &key(), NOW));
        assert_eq!(error, TsigError::BadTime as u16);
    }

    #[test]
    fn unsigned_and_unreadable_requests_are_told_apart() {
        assert!(matches!(check(axfr(), &key(), NOW), Checked::Unsigned(_)));
        let (mut request, _) = signed(&key(), NOW);
        request.truncate(request.len() - 3);
        assert!(matches!(check(request, &key(), NOW), Checked::Unreadable));
        let (mut looping, _) = signed(&key(), NOW);
        looping[12..14].copy_from_slice(&[0xC0, 12]); // a name pointing at itself
        assert!(matches!(check(looping, &key(), NOW), Checked::Unreadable));
    }

    #[test]
    fn keys_are_read_as_keymgr_prints_them_and_never_shown() {
        assert_eq!(key().name, b"\x08transfer\x07example\x03net\x00");
        assert_eq!(format!("{:?}", key()), "TsigKey(transfer.example.net.)");
        assert_eq!(
            TsigKey::new("x", "not base64!").unwrap_err(),
            TsigKeyError::Base64
        );
        assert_eq!(
            TsigKey::new("x", "c2hvcnQ=").unwrap_err(),
            TsigKeyError::Short(5)
        );
        assert!(matches!(
            TsigKey::new("a..b", SECRET),
            Err(TsigKeyError::Name(_))
        ));
    }
}
