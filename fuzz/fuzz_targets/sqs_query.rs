//! An SQS request of the query protocol (a form, `Action=..&Name.N.Field=..`) as the node's
//! SQS face reads it: into the JSON protocol's shape (repeated and nested parameters, their
//! numbers, their percent-encoding), then what its action reads before it touches the queue,
//! or refused with an SQS error; never a panic.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = dataplane::sqs::read_request_for_fuzzing(true, None, data);
});
