//! When a certificate is valid: read from its DER (RFC 5280 §4.1), for renewing at two thirds
//! of its life (the control plane's cluster certificate, a node's own). Only the few fields
//! before `validity` are walked.

/// `notBefore` and `notAfter` of the first certificate in `pem`, in seconds since 1970.
pub fn validity_of_pem(pem: &str) -> Option<(u64, u64)> {
    use rustls_pki_types::pem::PemObject;
    let der = rustls_pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()?
        .ok()?;
    validity(&der)
}

/// When a certificate valid `from`..`to` is due for renewal: two thirds into its life.
pub fn renewal_due((from, to): (u64, u64)) -> u64 {
    from + to.saturating_sub(from) * 2 / 3
}

/// `notBefore` and `notAfter` of a DER certificate.
pub fn validity(der: &[u8]) -> Option<(u64, u64)> {
    let (_, certificate, _) = element(der)?; // Certificate ::= SEQUENCE
    let (_, tbs, _) = element(certificate)?; // TBSCertificate ::= SEQUENCE
    let mut rest = tbs;
    let (tag, _, after) = element(rest)?;
    if tag == 0xa0 {
        rest = after; // [0] version
    }
    for _ in 0..3 {
        rest = element(rest)?.2; // serialNumber, signature, issuer
    }
    let (_, validity, _) = element(rest)?;
    let (not_before_tag, not_before, rest) = element(validity)?;
    let (not_after_tag, not_after, _) = element(rest)?;
    Some((
        time(not_before_tag, not_before)?,
        time(not_after_tag, not_after)?,
    ))
}

/// One DER element: its tag, its contents, and what follows it.
fn element(bytes: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let tag = *bytes.first()?;
    let first = *bytes.get(1)? as usize;
    let (length, header) = if first < 0x80 {
        (first, 2)
    } else {
        let count = first & 0x7f;
        if count == 0 || count > 4 {
            return None;
        }
        let length = bytes
            .get(2..2 + count)?
            .iter()
            .fold(0usize, |sum, byte| (sum << 8) | *byte as usize);
        (length, 2 + count)
    };
    let contents = bytes.get(header..header.checked_add(length)?)?;
    Some((tag, contents, &bytes[header + length..]))
}

/// UTCTime (0x17, `YYMMDDHHMMSSZ`) or GeneralizedTime (0x18, `YYYYMMDDHHMMSSZ`).
fn time(tag: u8, text: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(text).ok()?;
    let (year, rest) = match tag {
        0x17 => {
            let short: u64 = text.get(..2)?.parse().ok()?;
            (
                if short < 50 {
                    2000 + short
                } else {
                    1900 + short
                },
                text.get(2..)?,
            )
        }
        0x18 => (text.get(..4)?.parse().ok()?, text.get(4..)?),
        _ => return None,
    };
    let field = |at: usize| rest.get(at..at + 2)?.parse::<u64>().ok();
    let (month, day) = (field(0)?, field(2)?);
    let (hour, minute, second) = (field(4)?, field(6)?, field(8)?);
    if year < 1970 {
        return None;
    }
    let days = qe_shared::calendar::days_from_civil(year, month, day);
    Some(days * 86_400 + hour * 3600 + minute * 60 + second)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_validity_of_a_certificate() {
        let mut params = rcgen::CertificateParams::new(vec!["a.example".to_string()]).unwrap();
        params.not_before = rcgen::date_time_ymd(2026, 11, 29);
        params.not_after = rcgen::date_time_ymd(2027, 2, 27);
        let key = rcgen::KeyPair::generate().unwrap();
        let certificate = params.self_signed(&key).unwrap();
        let (from, to) = validity_of_pem(&certificate.pem()).unwrap();
        assert_eq!(from, 1_795_910_400, "2026-11-29T00:00:00Z");
        assert_eq!(to - from, 90 * 86_400);
        // From 2050 on, GeneralizedTime.
        params.not_after = rcgen::date_time_ymd(2051, 1, 1);
        let late = params.self_signed(&key).unwrap();
        let (_, to) = validity(late.der()).unwrap();
        assert_eq!(to, 2_556_144_000, "2051-01-01T00:00:00Z");
        assert_eq!(validity(b"\x30\x03\x02\x01"), None);
    }
}
