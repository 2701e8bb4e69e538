//! What a client sends as text: the JSON parser every request goes through, the login's
//! fields (checked in the order DECISIONS.md sets), and a publish's fields on both queue
//! types. Any text is read or refused with a code; none panics. Where the typed reading of
//! the hot requests (a publish, an ack) reads a text, the general reading means the same.

#![no_main]

use dataplane::session::request::{self, Parsed};
use dataplane::session::typed_reading;
use dataplane::session::{read_message, LoginForm};
use libfuzzer_sys::fuzz_target;
use qe_shared::protocol::QueueType;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(disagreement) = typed_reading::agrees(text) {
        panic!("{disagreement}");
    }
    let Parsed::Object(fields) = request::parse(text) else {
        return;
    };
    let _ = request::context(&fields);
    let _ = LoginForm::read(&fields, 1024);
    let _ = read_message(fields.clone(), QueueType::Distribute);
    let _ = read_message(fields, QueueType::Copy);
});
