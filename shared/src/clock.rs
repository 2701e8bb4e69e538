//! The one wall clock both planes read: what records, delays, expiries and certificates are
//! dated in. (A clock before 1970 reads as 1970: nothing here is worth a panic.)

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since 1970 (UTC).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

/// Seconds since 1970 (UTC).
pub fn now_secs() -> u64 {
    now_ms() / 1000
}
