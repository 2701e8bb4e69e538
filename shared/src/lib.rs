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
/// signature, every message's MD5), so one allocation and no formatter per byte.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(DIGITS[usize::from(byte >> 4)] as char);
        text.push(DIGITS[usize::from(byte & 0xf)] as char);
    }
    text
}
