//! A SigV4-signed request as the SQS faces check it: the input's lines are headers
//! (`name: value`, the `Authorization` header among them), then an empty line, the path and
//! query (`/path?query`), and the body. The `Authorization` header is parsed, the date
//! checked, and the signature verified with a secret; anything that does not read is refused
//! with a reason, never a panic. A request signed here with the same secret verifies.

#![no_main]

use libfuzzer_sys::fuzz_target;
use qe_shared::sqs::sigv4;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (head, rest) = text.split_once("\n\n").unwrap_or((text, ""));
    let (target, body) = rest.split_once('\n').unwrap_or((rest, ""));
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let headers: Vec<(&str, &str)> = head
        .lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim(), value.trim()))
        .collect();
    let request = sigv4::Signed {
        method: "POST",
        path,
        query,
        headers: &headers,
        body: body.as_bytes(),
    };
    let now = 1_790_000_000;
    let _ = sigv4::check_time(sigv4::header(&headers, "x-amz-date"), now);
    if let Some(authorization) = sigv4::header(&headers, "authorization") {
        if let Ok(parsed) = sigv4::parse_authorization(authorization) {
            let _ = sigv4::verify(&request, &parsed, "secret", now);
        }
    }
    // Signed here, with every header it holds, it verifies (when it can be signed at all).
    let date = sigv4::amz_date(now);
    let mut own: Vec<(&str, &str)> = headers
        .iter()
        .filter(|(name, _)| {
            let name = name.to_ascii_lowercase();
            name != "authorization" && name != "x-amz-date" && name != "host"
        })
        .copied()
        .collect();
    own.push(("host", "q.example"));
    own.push(("x-amz-date", &date));
    let mine = sigv4::Signed { headers: &own, ..request };
    if let Ok(header) = sigv4::sign(&mine, "AKIAFUZZ", "secret", "eu-west-1") {
        let verified = sigv4::parse_authorization(&header)
            .is_ok_and(|parsed| sigv4::verify(&mine, &parsed, "secret", now).is_ok());
        // Names with a character the header's own syntax uses (`;`, `,`, `=`, a space) or
        // that is not ASCII cannot be carried in `SignedHeaders`: only then may it fail.
        let plain = own.iter().all(|(name, _)| {
            name.bytes()
                .all(|b| b.is_ascii_graphic() && !matches!(b, b';' | b',' | b'='))
        });
        assert!(verified || !plain, "signed here, refused here: {header}");
    }
});
