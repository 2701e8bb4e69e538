//! Randomness from the operating system, for every id, secret, salt and nonce of both planes.
//! A system without a random source cannot make a secret nobody can guess, and nothing may go
//! on with a guessable one: each function panics then, with the same message.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

/// `N` random bytes.
pub fn bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).expect("the OS random source");
    bytes
}

/// `N` random bytes as URL-safe base64 without padding (24 bytes: 32 characters, 192 bits).
pub fn text<const N: usize>() -> String {
    URL_SAFE_NO_PAD.encode(bytes::<N>())
}

/// `len` characters drawn from `alphabet` (each byte taken modulo its length: an alphabet of
/// 32 or 64 characters draws them evenly).
pub fn drawn_from(alphabet: &[u8], len: usize) -> String {
    let mut bytes = vec![0u8; len];
    getrandom::fill(&mut bytes).expect("the OS random source");
    bytes
        .iter()
        .map(|b| alphabet[*b as usize % alphabet.len()] as char)
        .collect()
}

/// `len` lowercase letters and digits, safe in a DNS label; the first is a letter, so the
/// label never looks like a number.
pub fn label(len: usize) -> String {
    const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyz";
    const LETTERS_AND_DIGITS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    match len {
        0 => String::new(),
        _ => drawn_from(LETTERS, 1) + &drawn_from(LETTERS_AND_DIGITS, len - 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_its_length_and_alphabet() {
        assert_ne!(bytes::<16>(), bytes::<16>());
        let secret = text::<24>();
        assert_eq!(secret.len(), 32);
        assert!(secret
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        let label = label(12);
        assert_eq!(label.len(), 12);
        assert!(label.as_bytes()[0].is_ascii_lowercase());
        assert!(label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()));
        assert!(drawn_from(b"AB", 40)
            .bytes()
            .all(|b| b == b'A' || b == b'B'));
    }
}
