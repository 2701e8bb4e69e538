//! AWS Signature Version 4, checked on every request of the SQS face: the request's own
//! signature is computed again from the secret of the access key it names and compared in
//! constant time. Only what the SDKs send is taken: the `Authorization` header form (not a
//! presigned URL), service `sqs`, any region (the one the client signed for), and a request
//! time within [`MAX_SKEW_SECS`] of the node's clock.

use crate::hmac::hmac_sha256;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// How far a request's `X-Amz-Date` may be from the node's clock (AWS allows 15 minutes).
pub const MAX_SKEW_SECS: u64 = 15 * 60;

/// Why a request's signature is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// No `Authorization` header, or one that is not SigV4 (`MissingAuthenticationToken`).
    #[error("the request is not signed with AWS Signature Version 4")]
    Missing,
    /// The header does not read (`IncompleteSignature`).
    #[error("the signature is incomplete: {0}")]
    Incomplete(&'static str),
    /// The access key is not one of this queue's (`InvalidClientTokenId`).
    #[error("the access key id is not known here")]
    UnknownKey,
    /// The request time is too far from now (`RequestExpired`).
    #[error("the request time is more than 15 minutes from the node's clock")]
    Expired,
    /// The signature is not the one the key gives (`SignatureDoesNotMatch`).
    #[error("the request signature does not match the one the key gives")]
    Mismatch,
}

/// What the `Authorization` header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorization<'a> {
    pub access_key_id: &'a str,
    /// `YYYYMMDD`, as signed.
    pub date: &'a str,
    pub region: &'a str,
    pub service: &'a str,
    /// Lowercase, `;`-separated, sorted, as signed.
    pub signed_headers: &'a str,
    /// 64 hex digits.
    pub signature: &'a str,
}

/// Reads `AWS4-HMAC-SHA256 Credential=KEY/DATE/REGION/SERVICE/aws4_request,
/// SignedHeaders=a;b, Signature=HEX`.
pub fn parse_authorization(header: &str) -> Result<Authorization<'_>, Refused> {
    let rest = header
        .strip_prefix("AWS4-HMAC-SHA256 ")
        .ok_or(Refused::Missing)?;
    let (mut credential, mut signed_headers, mut signature) = (None, None, None);
    for part in rest.split(',') {
        let (name, value) = part
            .trim()
            .split_once('=')
            .ok_or(Refused::Incomplete("a part without ="))?;
        match name {
            "Credential" => credential = Some(value),
            "SignedHeaders" => signed_headers = Some(value),
            "Signature" => signature = Some(value),
            _ => return Err(Refused::Incomplete("an unknown part")),
        }
    }
    let credential = credential.ok_or(Refused::Incomplete("no Credential"))?;
    let mut scope = credential.split('/');
    let mut next = || scope.next().filter(|part| !part.is_empty());
    let access_key_id = next().ok_or(Refused::Incomplete("no access key id"))?;
    let date = next().ok_or(Refused::Incomplete("no date in the scope"))?;
    let region = next().ok_or(Refused::Incomplete("no region in the scope"))?;
    let service = next().ok_or(Refused::Incomplete("no service in the scope"))?;
    if next() != Some("aws4_request") || next().is_some() {
        return Err(Refused::Incomplete(
            "the scope does not end in aws4_request",
        ));
    }
    let signature = signature.ok_or(Refused::Incomplete("no Signature"))?;
    if signature.len() != 64 || !signature.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Refused::Incomplete("the signature is not 64 hex digits"));
    }
    Ok(Authorization {
        access_key_id,
        date,
        region,
        service,
        signed_headers: signed_headers.ok_or(Refused::Incomplete("no SignedHeaders"))?,
        signature,
    })
}

/// A request as SigV4 reads it.
pub struct Signed<'a> {
    pub method: &'a str,
    /// The path as sent (already URI-encoded by the client).
    pub path: &'a str,
    /// The query string as sent, without `?` ("" for none).
    pub query: &'a str,
    /// Every header, names in any case (borrowed from the request: a request's headers are
    /// read here, never kept).
    pub headers: &'a [(&'a str, &'a str)],
    pub body: &'a [u8],
}

/// A request's headers whose values read as text, as `Signed::headers` takes them (a value
/// that is not text cannot have been signed as the SDKs sign).
pub fn text_headers<'a>(
    headers: impl IntoIterator<Item = (&'a str, &'a [u8])>,
) -> Vec<(&'a str, &'a str)> {
    headers
        .into_iter()
        .filter_map(|(name, value)| Some((name, std::str::from_utf8(value).ok()?)))
        .collect()
}

/// Checks `request`'s signature with `secret`, the secret of the key its `Authorization`
/// names, at `now_secs`.
pub fn verify(
    request: &Signed<'_>,
    authorization: &Authorization<'_>,
    secret: &str,
    now_secs: u64,
) -> Result<(), Refused> {
    verify_with(
        request,
        authorization,
        secret,
        now_secs,
        &SigningKeys::default(),
    )
}

/// [`verify`], with the day's signing key taken from `keys` (and kept there) when it holds it.
pub fn verify_with(
    request: &Signed<'_>,
    authorization: &Authorization<'_>,
    secret: &str,
    now_secs: u64,
    keys: &SigningKeys,
) -> Result<(), Refused> {
    if authorization.service != "sqs" {
        return Err(Refused::Incomplete("the service in the scope is not sqs"));
    }
    let amz_date = header(request.headers, "x-amz-date");
    check_time(amz_date, now_secs)?;
    let amz_date = amz_date.unwrap_or_default().trim();
    if !amz_date.starts_with(authorization.date) || authorization.date.len() != 8 {
        return Err(Refused::Mismatch);
    }
    let scope = Scope {
        date: authorization.date,
        region: authorization.region,
        service: authorization.service,
    };
    let key = keys.get(secret, &scope);
    let expected = signature_by(
        request,
        authorization.signed_headers,
        amz_date,
        &scope,
        &key,
    )?;
    // Hex digits in either case, as sent (64 of them, as `parse_authorization` reads it).
    let mut sent = [0u8; 64];
    let sent = match sent.get_mut(..authorization.signature.len()) {
        Some(sent) => {
            sent.copy_from_slice(authorization.signature.as_bytes());
            sent.make_ascii_lowercase();
            sent
        }
        None => return Err(Refused::Mismatch),
    };
    match bool::from(expected.as_bytes().ct_eq(sent)) {
        true => Ok(()),
        false => Err(Refused::Mismatch),
    }
}

/// The `Authorization` header that signs `request` for SQS in `region` with key
/// `access_key_id` and its `secret`: every header it holds is signed, and they must hold
/// `host` and `x-amz-date` (see [`amz_date`]). What a node sends another queue's node its dead
/// letters with.
pub fn sign(
    request: &Signed<'_>,
    access_key_id: &str,
    secret: &str,
    region: &str,
) -> Result<String, Refused> {
    let amz_date =
        header(request.headers, "x-amz-date").ok_or(Refused::Incomplete("no X-Amz-Date header"))?;
    let date = amz_date
        .get(..8)
        .ok_or(Refused::Incomplete("X-Amz-Date does not read"))?;
    let mut names: Vec<String> = request
        .headers
        .iter()
        .map(|(name, _)| name.to_ascii_lowercase())
        .collect();
    names.sort();
    names.dedup();
    let signed_headers = names.join(";");
    let signature = signature(request, &signed_headers, amz_date, region, "sqs", secret)?;
    Ok(format!(
        "AWS4-HMAC-SHA256 Credential={access_key_id}/{date}/{region}/sqs/aws4_request, \
         SignedHeaders={signed_headers}, Signature={signature}"
    ))
}

/// The headers of an SQS request of the JSON protocol calling `action` (`SendMessageBatch`)
/// at `host` (`HOST[:PORT]`) with `body`, signed at `now_secs` with key `access_key_id` and
/// its `secret` for `region`: `content-type`, `host`, `x-amz-date`, `x-amz-target` and
/// `authorization`, as an SDK sends them.
pub fn signed_json_headers(
    host: &str,
    action: &str,
    body: &[u8],
    (access_key_id, secret, region): (&str, &str, &str),
    now_secs: u64,
) -> Result<Vec<(String, String)>, Refused> {
    let mut headers = vec![
        (
            "content-type".to_string(),
            "application/x-amz-json-1.0".to_string(),
        ),
        ("host".to_string(), host.to_string()),
        ("x-amz-date".to_string(), amz_date(now_secs)),
        ("x-amz-target".to_string(), format!("AmazonSQS.{action}")),
    ];
    let signed = Signed {
        method: "POST",
        path: "/",
        query: "",
        headers: &borrowed(&headers),
        body,
    };
    let authorization = sign(&signed, access_key_id, secret, region)?;
    headers.push(("authorization".to_string(), authorization));
    Ok(headers)
}

/// `now_secs` as `X-Amz-Date` gives it: `YYYYMMDDTHHMMSSZ`.
pub fn amz_date(now_secs: u64) -> String {
    let (year, month, day) = crate::calendar::civil_from_days(now_secs / 86_400);
    let seconds = now_secs % 86_400;
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60
    )
}

/// The signature (hex) of `request` at `amz_date` with the headers `signed_headers` names,
/// for `service` in `region`, by `secret`.
fn signature(
    request: &Signed<'_>,
    signed_headers: &str,
    amz_date: &str,
    region: &str,
    service: &str,
    secret: &str,
) -> Result<String, Refused> {
    let scope = Scope {
        date: amz_date.get(..8).unwrap_or_default(),
        region,
        service,
    };
    let key = signing_key(secret, scope.date, region, service);
    signature_by(request, signed_headers, amz_date, &scope, &key)
}

/// What a signing key is for: a day (`YYYYMMDD`), a region and a service.
#[derive(PartialEq, Eq)]
struct Scope<'a> {
    date: &'a str,
    region: &'a str,
    service: &'a str,
}

/// The signature (hex) of `request` at `amz_date` by the signing `key` of `scope`.
fn signature_by(
    request: &Signed<'_>,
    signed_headers: &str,
    amz_date: &str,
    scope: &Scope<'_>,
    key: &[u8; 32],
) -> Result<String, Refused> {
    let canonical = canonical_request(request, signed_headers)?;
    let mut to_sign = String::with_capacity(160);
    for part in [
        "AWS4-HMAC-SHA256\n",
        amz_date,
        "\n",
        scope.date,
        "/",
        scope.region,
        "/",
        scope.service,
        "/aws4_request\n",
    ] {
        to_sign.push_str(part);
    }
    crate::push_hex(&mut to_sign, &Sha256::digest(canonical.as_bytes()));
    Ok(crate::hex(&hmac_sha256(key, to_sign.as_bytes())))
}

/// A signing key kept for its scope.
struct KeptKey {
    date: String,
    region: String,
    service: String,
    key: [u8; 32],
}

/// The signing keys of the secrets seen lately: deriving one takes four HMACs, and it serves
/// every request its secret signs that day for that region and service. One per secret, the
/// latest; forgotten all at once past [`SigningKeys::MOST`] (a node's keys are a handful, the
/// control plane's account keys a few per account).
#[derive(Default)]
pub struct SigningKeys {
    keys: std::sync::Mutex<std::collections::HashMap<String, KeptKey>>,
}

impl SigningKeys {
    const MOST: usize = 1024;

    /// `secret`'s signing key for `scope`, kept or made (and kept).
    fn get(&self, secret: &str, scope: &Scope<'_>) -> [u8; 32] {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(kept) = keys.get(secret) {
            let kept_scope = Scope {
                date: &kept.date,
                region: &kept.region,
                service: &kept.service,
            };
            if kept_scope == *scope {
                return kept.key;
            }
        }
        let key = signing_key(secret, scope.date, scope.region, scope.service);
        if keys.len() >= Self::MOST {
            keys.clear();
        }
        let kept = KeptKey {
            date: scope.date.to_string(),
            region: scope.region.to_string(),
            service: scope.service.to_string(),
            key,
        };
        keys.insert(secret.to_string(), kept);
        key
    }
}

/// Whether `X-Amz-Date` (its value, if sent) reads and is within the skew of `now_secs`.
pub fn check_time(amz_date: Option<&str>, now_secs: u64) -> Result<(), Refused> {
    let amz_date = amz_date.ok_or(Refused::Incomplete(
        "no X-Amz-Date header (a Date header is not taken)",
    ))?;
    let time =
        parse_amz_date(amz_date.trim()).ok_or(Refused::Incomplete("X-Amz-Date does not read"))?;
    match time.abs_diff(now_secs) > MAX_SKEW_SECS {
        true => Err(Refused::Expired),
        false => Ok(()),
    }
}

/// The key a day's requests to one region's service are signed with.
pub fn signing_key(secret: &str, date: &str, region: &str, service: &str) -> [u8; 32] {
    let date_key = hmac_sha256(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    let region_key = hmac_sha256(&date_key, region.as_bytes());
    let service_key = hmac_sha256(&region_key, service.as_bytes());
    hmac_sha256(&service_key, b"aws4_request")
}

/// The canonical request: method, path, sorted query, the signed headers' lines, their
/// names, and the body's SHA-256 (or `X-Amz-Content-Sha256` when the client sent it). Built
/// in one string: it is made for every request.
fn canonical_request(request: &Signed<'_>, signed_headers: &str) -> Result<String, Refused> {
    let names = signed_headers.split(';');
    let mut sorted_with_host = false;
    let mut previous = "";
    let mut text = String::with_capacity(512);
    text.push_str(request.method);
    text.push('\n');
    text.push_str(match request.path {
        "" => "/",
        path => path,
    });
    text.push('\n');
    text.push_str(&canonical_query(request.query));
    text.push('\n');
    for name in names {
        if name <= previous {
            // Empty, or not after the one before.
            return Err(not_sorted());
        }
        sorted_with_host |= name == "host";
        previous = name;
        text.push_str(name);
        text.push(':');
        let mut values = request
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .peekable();
        if values.peek().is_none() {
            return Err(Refused::Incomplete("a signed header is missing"));
        }
        for (i, (_, value)) in values.enumerate() {
            if i > 0 {
                text.push(',');
            }
            push_collapsed(&mut text, value);
        }
        text.push('\n');
    }
    if !sorted_with_host {
        return Err(not_sorted());
    }
    text.push('\n');
    text.push_str(signed_headers);
    text.push('\n');
    // The payload's hash as the client signed it: the body's, or the literal
    // UNSIGNED-PAYLOAD when it chose not to sign the body (TLS still protects it).
    match header(request.headers, "x-amz-content-sha256") {
        Some("UNSIGNED-PAYLOAD") => text.push_str("UNSIGNED-PAYLOAD"),
        sent => {
            let start = text.len();
            crate::push_hex(&mut text, &Sha256::digest(request.body));
            let body_hash = &text[start..];
            if sent.is_some_and(|hash| !hash.eq_ignore_ascii_case(body_hash)) {
                return Err(Refused::Mismatch);
            }
        }
    }
    Ok(text)
}

fn not_sorted() -> Refused {
    Refused::Incomplete("SignedHeaders are not sorted lowercase names with host")
}

/// The query's pairs, each name and value URI-encoded as SigV4 says, sorted.
fn canonical_query(query: &str) -> String {
    if query.is_empty() {
        return String::new(); // what every JSON-protocol request has
    }
    let mut pairs: Vec<(String, String)> = query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            (reencode(name), reencode(value))
        })
        .collect();
    pairs.sort();
    let pairs: Vec<String> = pairs
        .into_iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    pairs.join("&")
}

/// A query part decoded and encoded again the SigV4 way (unreserved characters as they are,
/// everything else `%XX` in capitals), so that clients that encode differently agree.
fn reencode(part: &str) -> String {
    const SIGV4: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    let decoded: Vec<u8> = percent_encoding::percent_decode_str(part).collect();
    percent_encoding::percent_encode(&decoded, SIGV4).to_string()
}

/// `value` with its runs of spaces made one and its ends trimmed, as SigV4 signs a header.
fn push_collapsed(text: &mut String, value: &str) {
    for (i, word) in value.split_whitespace().enumerate() {
        if i > 0 {
            text.push(' ');
        }
        text.push_str(word);
    }
}

/// Headers held as owned text, as [`Signed::headers`] borrows them.
pub fn borrowed(headers: &[(String, String)]) -> Vec<(&str, &str)> {
    let pairs = headers.iter();
    pairs
        .map(|(name, value)| (name.as_str(), value.as_str()))
        .collect()
}

/// The value of header `name` (any case), trimmed.
pub fn header<'a>(headers: &[(&'a str, &'a str)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim())
}

/// `YYYYMMDDTHHMMSSZ` as seconds since 1970.
fn parse_amz_date(text: &str) -> Option<u64> {
    let bytes = text.as_bytes();
    if bytes.len() != 16 || bytes[8] != b'T' || bytes[15] != b'Z' {
        return None;
    }
    let number = |range: std::ops::Range<usize>| text.get(range)?.parse::<u64>().ok();
    let (year, month, day) = (number(0..4)?, number(4..6)?, number(6..8)?);
    let (hour, minute, second) = (number(9..11)?, number(11..13)?, number(13..15)?);
    if !(1970..=9999).contains(&year)
        || !(1..=12).contains(&month)
        || !(1..=crate::calendar::days_in_month(year, month)).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let days = crate::calendar::days_from_civil(year, month, day);
    Some(days * 86_400 + hour * 3600 + minute * 60 + second)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AWS's own worked example (the Signature Version 4 documentation's IAM `ListUsers`
    /// GET request), with the service set to sqs in the scope where it must be.
    fn example_headers() -> Vec<(&'static str, &'static str)> {
        vec![
            (
                "Content-Type",
                "application/x-www-form-urlencoded; charset=utf-8",
            ),
            ("Host", "iam.amazonaws.com"),
            ("X-Amz-Date", "20150830T123600Z"),
        ]
    }

    const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
    /// 2015-08-30 12:36:00 UTC.
    const THEN: u64 = 1_440_938_160;

    #[test]
    fn a_request_signed_here_is_verified_here_and_a_changed_one_is_not() {
        let now = 1_790_000_000;
        let date = amz_date(now);
        assert_eq!(parse_amz_date(&date), Some(now), "{date}");
        let headers = vec![
            ("host", "q1.q.example:9443"),
            ("x-amz-date", date.as_str()),
            ("X-Amz-Target", "AmazonSQS.SendMessageBatch"),
        ];
        let body = br#"{"QueueUrl":"x"}"#;
        let request = Signed {
            method: "POST",
            path: "/",
            query: "",
            headers: &headers,
            body,
        };
        let header = sign(&request, "QEDLKEY", SECRET, "eu-west-1").unwrap();
        let authorization = parse_authorization(&header).unwrap();
        assert_eq!(authorization.access_key_id, "QEDLKEY");
        assert_eq!(authorization.signed_headers, "host;x-amz-date;x-amz-target");
        assert_eq!(verify(&request, &authorization, SECRET, now), Ok(()));
        let changed = Signed {
            body: br#"{"QueueUrl":"y"}"#,
            ..request
        };
        assert_eq!(
            verify(&changed, &authorization, SECRET, now),
            Err(Refused::Mismatch)
        );
        assert_eq!(
            verify(&request, &authorization, "another", now),
            Err(Refused::Mismatch)
        );
        // The signature's hex digits in either case; a signature of another length (made
        // here, as the parser refuses it) does not match, and panics nothing.
        let capitals = authorization.signature.to_ascii_uppercase();
        let shouting = Authorization {
            signature: &capitals,
            ..authorization.clone()
        };
        assert_eq!(verify(&request, &shouting, SECRET, now), Ok(()));
        for signature in [&capitals[1..], &format!("{capitals}0")] {
            let odd = Authorization {
                signature,
                ..authorization.clone()
            };
            assert_eq!(verify(&request, &odd, SECRET, now), Err(Refused::Mismatch));
        }
    }

    #[test]
    fn a_body_hash_sent_must_be_the_bodys() {
        let now = 1_790_000_000;
        let date = amz_date(now);
        let body = br#"{"QueueUrl":"x"}"#;
        let hash = crate::hex(&Sha256::digest(body));
        // Signed with the header `signed` (or without it), then sent with the hash `sent`.
        let verified = |signed: Option<&str>, sent: &str| {
            let mut headers = vec![("host", "q1.q.example"), ("x-amz-date", date.as_str())];
            headers.extend(signed.map(|hash| ("x-amz-content-sha256", hash)));
            let mut request = Signed {
                method: "POST",
                path: "/",
                query: "",
                headers: &headers,
                body,
            };
            let header = sign(&request, "AKID", SECRET, "eu-west-1").unwrap();
            let sent_headers = [headers[0], headers[1], ("x-amz-content-sha256", sent)];
            request.headers = &sent_headers;
            verify(
                &request,
                &parse_authorization(&header).unwrap(),
                SECRET,
                now,
            )
        };
        let capitals = hash.to_ascii_uppercase();
        for hash in [&hash, &capitals] {
            assert_eq!(verified(Some(hash), hash), Ok(()));
            assert_eq!(verified(None, hash), Ok(()), "sent, not signed");
        }
        assert_eq!(
            verified(Some("UNSIGNED-PAYLOAD"), "UNSIGNED-PAYLOAD"),
            Ok(())
        );
        let other = crate::hex(&Sha256::digest(b"another body"));
        assert_eq!(verified(None, &other), Err(Refused::Mismatch));
    }

    #[test]
    fn the_canonical_request_and_signing_key_are_the_documentations() {
        let headers = example_headers();
        let request = Signed {
            method: "GET",
            path: "/",
            query: "Action=ListUsers&Version=2010-05-08",
            headers: &headers,
            body: b"",
        };
        let canonical = canonical_request(&request, "content-type;host;x-amz-date").unwrap();
        assert_eq!(
            crate::hex(&Sha256::digest(canonical.as_bytes())),
            "f536975d06c0309214f805bb90ccff089219ecd68b2577efef23edd43b7e1a59"
        );
        let key = signing_key(SECRET, "20150830", "us-east-1", "iam");
        let to_sign = format!(
            "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/iam/aws4_request\n{}",
            "f536975d06c0309214f805bb90ccff089219ecd68b2577efef23edd43b7e1a59"
        );
        assert_eq!(
            crate::hex(&hmac_sha256(&key, to_sign.as_bytes())),
            "5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
        );
    }

    fn signed_for(secret: &str, body: &[u8], headers: &[(&str, &str)]) -> String {
        let request = Signed {
            method: "POST",
            path: "/",
            query: "",
            headers,
            body,
        };
        let canonical = canonical_request(&request, "host;x-amz-date").unwrap();
        let to_sign = format!(
            "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/eu-west-1/sqs/aws4_request\n{}",
            crate::hex(&Sha256::digest(canonical.as_bytes()))
        );
        let key = signing_key(secret, "20150830", "eu-west-1", "sqs");
        format!(
            "AWS4-HMAC-SHA256 Credential=AKID/20150830/eu-west-1/sqs/aws4_request, \
             SignedHeaders=host;x-amz-date, Signature={}",
            crate::hex(&hmac_sha256(&key, to_sign.as_bytes()))
        )
    }

    #[test]
    fn a_request_verifies_with_its_keys_secret_only_and_untampered_and_in_time() {
        let headers = example_headers();
        let body = br#"{"QueueUrl":"q"}"#;
        let header = signed_for(SECRET, body, &headers);
        let authorization = parse_authorization(&header).unwrap();
        assert_eq!(authorization.access_key_id, "AKID");
        assert_eq!(authorization.region, "eu-west-1");
        let request = |body: &'static [u8]| Signed {
            method: "POST",
            path: "/",
            query: "",
            headers: &headers,
            body,
        };
        assert_eq!(verify(&request(body), &authorization, SECRET, THEN), Ok(()));
        assert_eq!(
            verify(&request(body), &authorization, "another secret", THEN),
            Err(Refused::Mismatch)
        );
        assert_eq!(
            verify(
                &request(br#"{"QueueUrl":"r"}"#),
                &authorization,
                SECRET,
                THEN
            ),
            Err(Refused::Mismatch)
        );
        assert_eq!(
            verify(&request(body), &authorization, SECRET, THEN + 16 * 60),
            Err(Refused::Expired)
        );
        assert_eq!(
            verify(&request(body), &authorization, SECRET, THEN - 14 * 60),
            Ok(())
        );
    }

    #[test]
    fn headers_that_do_not_read_are_refused_as_incomplete_or_missing() {
        assert_eq!(parse_authorization("Bearer x"), Err(Refused::Missing));
        for bad in [
            "AWS4-HMAC-SHA256 Credential=AKID/20150830/eu-west-1/sqs, SignedHeaders=host, \
             Signature=00",
            "AWS4-HMAC-SHA256 SignedHeaders=host, Signature=00",
            "AWS4-HMAC-SHA256 Credential=AKID/20150830/eu-west-1/sqs/aws4_request, \
             SignedHeaders=host, Signature=zz",
        ] {
            assert!(
                matches!(parse_authorization(bad), Err(Refused::Incomplete(_))),
                "{bad}"
            );
        }
        assert_eq!(parse_amz_date("20150830T123600Z"), Some(THEN));
        assert_eq!(parse_amz_date("20150230T123600Z"), None);
        assert_eq!(parse_amz_date("19691231T235959Z"), None, "before 1970");
        assert_eq!(parse_amz_date("2015-08-30T12:36:00Z"), None);
    }

    #[test]
    fn a_kept_signing_key_serves_its_own_day_region_and_secret_only() {
        let headers = example_headers();
        let body = br#"{"QueueUrl":"q"}"#;
        let request = Signed {
            method: "POST",
            path: "/",
            query: "",
            headers: &headers,
            body,
        };
        let keys = SigningKeys::default();
        let header = signed_for(SECRET, body, &headers);
        let authorization = parse_authorization(&header).unwrap();
        for _ in 0..2 {
            let verified = verify_with(&request, &authorization, SECRET, THEN, &keys);
            assert_eq!(verified, Ok(()), "made, then kept");
        }
        // The same secret for another region, and another secret: each its own key.
        let elsewhere = header.replace("eu-west-1", "us-east-1");
        let elsewhere = parse_authorization(&elsewhere).unwrap();
        let verified = verify_with(&request, &elsewhere, SECRET, THEN, &keys);
        assert_eq!(verified, Err(Refused::Mismatch));
        let verified = verify_with(&request, &authorization, "another", THEN, &keys);
        assert_eq!(verified, Err(Refused::Mismatch));
        let verified = verify_with(&request, &authorization, SECRET, THEN, &keys);
        assert_eq!(
            verified,
            Ok(()),
            "the region's key did not replace it wrongly"
        );
    }

    #[test]
    fn signed_headers_must_be_sorted_lowercase_names_with_host() {
        let headers = example_headers();
        let request = Signed {
            method: "GET",
            path: "/",
            query: "",
            headers: &headers,
            body: b"",
        };
        for bad in [
            "x-amz-date;host",
            "host;host",
            "content-type;x-amz-date",
            "host;",
            "",
        ] {
            assert!(
                matches!(
                    canonical_request(&request, bad),
                    Err(Refused::Incomplete(_))
                ),
                "{bad}"
            );
        }
        assert!(canonical_request(&request, "host;x-amz-content-sha256").is_err());
        assert!(canonical_request(&request, "content-type;host").is_ok());
    }

    #[test]
    fn query_strings_are_sorted_and_encoded_the_sigv4_way() {
        assert_eq!(canonical_query("b=2&a=1"), "a=1&b=2");
        assert_eq!(canonical_query("a=x%2fy&c= "), "a=x%2Fy&c=%20");
        assert_eq!(canonical_query(""), "");
    }
}
