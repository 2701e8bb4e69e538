//! The node's TOML config file: any text is read, or refused with a `ConfigError`; with
//! default flags, what it reads is merged into a `Config` or refused.

#![no_main]

use dataplane::config::{Config, ConfigFile, Flags};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(file) = ConfigFile::parse(text) {
        let _ = Config::merge(file, Flags::default());
    }
});
