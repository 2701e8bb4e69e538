//! The node's TOML config file: any text is read and checked (`ConfigFile::given`), or refused
//! with a `ConfigError`; with default flags, what it gives is merged into a `Config` or
//! refused.

#![no_main]

use dataplane::config::{Config, ConfigFile, Flags};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(given) = ConfigFile::parse(text).and_then(ConfigFile::given) {
        let _ = Config::merge(given, Flags::default());
    }
});
