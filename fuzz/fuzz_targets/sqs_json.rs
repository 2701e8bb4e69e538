//! An SQS request of the JSON protocol as the node's SQS face reads it: the first line of the
//! input is the `X-Amz-Target` header, the rest the body. It is read (its action known, its
//! body an object), then what its action reads before it touches the queue (queue attributes
//! and their redrive policies, batch entries, message attributes and their digest, receipt
//! handles), or refused with an SQS error; never a panic.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (target, body) = match data.iter().position(|b| *b == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (&data[..0], data),
    };
    let target = std::str::from_utf8(target).ok();
    let _ = dataplane::sqs::read_request_for_fuzzing(false, target, body);
});
