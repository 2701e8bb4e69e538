//! What the data plane and the control plane both speak. No I/O, no runtime.
//!
//! - [`code`]: every failure code of the manual's Reference, with its reason text.
//! - [`settings`]: the queue's settings (names, defaults, ranges, read/write), one table for the
//!   config loader, `getcfg` and `setcfg`.
//! - [`password`]: passwords as they may rest (salted hashes), for both sides.
//! - [`labels`]: what a region or instance type may be called.
//! - [`node_channel`]: what a node and its control plane say to each other; [`build`]: what
//!   both check of a node build.
//! - [`console_token`]: the web console's short-lived logins to a node; [`hmac`] signs them
//!   and node credentials.
//! - [`backoff`]: waits that double after each failure, for every retry loop.
//! - [`clock`]: the one wall clock, in ms or seconds since 1970; [`random`]: every random id,
//!   secret, salt and nonce.
//! - [`protocol`]: the words of the wire protocol: roles, queue types, limits on login fields.
//! - [`panics`]: a panic ends a serving process, in every build.
//! - `synced_sled` (feature `sled`): sled made durable by a real fsync, for both planes' stores.

pub mod backoff;
pub mod build;
pub mod calendar;
pub mod clock;
pub mod code;
pub mod console_token;
pub mod files;
pub mod hmac;
pub mod labels;
#[cfg(feature = "logging")]
pub mod logging;
pub mod node_channel;
pub mod panics;
pub mod password;
pub mod protocol;
pub mod random;
pub mod settings;
pub mod sqs;
#[cfg(feature = "sled")]
pub mod synced_sled;

pub use code::Code;

/// Bytes as lowercase hex: tokens, digests, salts. On the SQS face's path (every request's
/// signature, every message's MD5), so one allocation and eight bytes at a time.
pub fn hex(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(bytes.len() * 2);
    push_hex(&mut text, bytes);
    text
}

/// [`hex`], written at the end of `text` (a digest inside a longer text, without a string of
/// its own).
pub fn push_hex(text: &mut String, bytes: &[u8]) {
    for chunk in bytes.chunks(8) {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        let digits = hex_digits(u64::from_be_bytes(word));
        text.push_str(
            std::str::from_utf8(&digits[..chunk.len() * 2]).expect("hex digits are ASCII"),
        );
    }
}

/// The 16 lowercase hex digits of `n`, most significant first: the one hex encoder, for
/// [`hex`] and for every message id the node writes (three a message, hence inlined).
#[inline]
pub fn hex_digits(n: u64) -> [u8; 16] {
    // Spread the nibbles apart until each has a byte of its own, the least significant in the
    // lowest byte (no carries: every step only moves bits into zeros).
    let mut nibbles = u128::from(n);
    nibbles = (nibbles | (nibbles << 32)) & 0x0000_0000_FFFF_FFFF_0000_0000_FFFF_FFFF;
    nibbles = (nibbles | (nibbles << 16)) & 0x0000_FFFF_0000_FFFF_0000_FFFF_0000_FFFF;
    nibbles = (nibbles | (nibbles << 8)) & 0x00FF_00FF_00FF_00FF_00FF_00FF_00FF_00FF;
    nibbles = (nibbles | (nibbles << 4)) & 0x0F0F_0F0F_0F0F_0F0F_0F0F_0F0F_0F0F_0F0F;
    // A byte holds 0 to 15: adding 6 carries into its bit 4 exactly when it is 10 or more,
    // a letter, which starts 0x27 further from '0' + 10 than a digit would.
    const EACH_BYTE: u128 = 0x0101_0101_0101_0101_0101_0101_0101_0101;
    let letters = ((nibbles + 6 * EACH_BYTE) >> 4) & EACH_BYTE;
    let ascii = nibbles + u128::from(b'0') * EACH_BYTE + letters * 0x27;
    ascii.to_be_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_writes_every_byte_as_two_lowercase_digits() {
        let every_byte: Vec<u8> = (0..=255).collect();
        let by_byte = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
        // Every length around the eight-byte chunks, and every byte value in every place.
        for length in 0..=every_byte.len() {
            assert_eq!(hex(&every_byte[..length]), by_byte(&every_byte[..length]));
        }
        for start in 1..8 {
            assert_eq!(hex(&every_byte[start..]), by_byte(&every_byte[start..]));
        }
        assert_eq!(&hex_digits(0x0123_4567_89ab_cdef), b"0123456789abcdef");
        assert_eq!(&hex_digits(u64::MAX), b"ffffffffffffffff");
    }
}
