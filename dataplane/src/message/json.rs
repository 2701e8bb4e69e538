//! JSON written by hand into a frame's bytes. Every message's delivery frame and every publish
//! and ack reply are written here, where serde's and `fmt`'s general machinery (a call through
//! `dyn Write` for each piece, a formatter for each number) cost more than the writing. What is
//! written is exactly what `serde_json` writes for the same values (see the tests).

use super::ids::MessageId;
use std::cell::RefCell;

/// Frames up to this size are written into a buffer the thread keeps, then copied into their
/// own allocation by `finish`: one allocation of the exact size, where a growing vector takes
/// several.
const KEPT_BUFFER: usize = 4 << 10;

/// What `write` writes, handed to `finish` to be kept.
pub fn written<R>(write: impl FnOnce(&mut Vec<u8>), finish: impl FnOnce(&[u8]) -> R) -> R {
    thread_local! {
        static BUFFER: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(KEPT_BUFFER));
    }
    BUFFER.with(|buffer| match buffer.try_borrow_mut() {
        Ok(mut out) => {
            out.clear();
            write(&mut out);
            let kept = finish(&out);
            if out.capacity() > KEPT_BUFFER {
                // A long message's frame: its buffer is not kept for the short ones.
                *out = Vec::with_capacity(KEPT_BUFFER);
            }
            kept
        }
        // Only if a `write` or `finish` writes a frame itself, which none does.
        Err(_) => {
            let mut out = Vec::new();
            write(&mut out);
            finish(&out)
        }
    })
}

/// `text` as a JSON string.
pub fn push_str(out: &mut Vec<u8>, text: &str) {
    if is_plain_text(text.as_bytes()) {
        out.reserve(text.len() + 2);
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
    } else {
        push_value(out, text);
    }
}

/// Whether `bytes` can stand as a JSON string's content as they are: nothing in them that
/// needs an escape.
pub fn is_plain_text(bytes: &[u8]) -> bool {
    first_to_escape(bytes).is_none()
}

/// Where the first byte is that a JSON string cannot hold as it is: a control character, a
/// quote or a backslash (what `serde_json` escapes; it writes everything else as it is).
/// Eight bytes are looked at a time.
pub fn first_to_escape(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    // A high bit set in each byte that is zero (and, past the first such, maybe others).
    let zero_bytes = |word: u64| word.wrapping_sub(ONES) & !word & HIGH;
    let mut start = 0;
    for chunk in bytes.chunks_exact(8) {
        let word = u64::from_ne_bytes(chunk.try_into().expect("8 bytes"));
        let special = zero_bytes(word ^ (ONES * u64::from(b'"')))
            | zero_bytes(word ^ (ONES * u64::from(b'\\')))
            | (word.wrapping_sub(ONES * 0x20) & !word & HIGH);
        if special != 0 {
            break;
        }
        start += 8;
    }
    let found = bytes[start..]
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
    Some(start + found)
}

/// A whole number.
pub fn push_integer(out: &mut Vec<u8>, n: impl itoa::Integer) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// A message id as a JSON string.
pub fn push_id(out: &mut Vec<u8>, id: MessageId) {
    out.push(b'"');
    out.extend_from_slice(&id.text());
    out.push(b'"');
}

/// Anything else, as `serde_json` writes it (into a vector, which takes every write; a
/// `serde_json::Value` and a text never fail to serialize).
pub fn push_value(out: &mut Vec<u8>, value: &(impl serde::Serialize + ?Sized)) {
    serde_json::to_writer(out, value).expect("a vector takes every write");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written_str(text: &str) -> Vec<u8> {
        let mut out = Vec::new();
        push_str(&mut out, text);
        out
    }

    #[test]
    fn a_string_is_written_as_serde_json_writes_it() {
        let mut texts: Vec<String> = [
            "",
            "plain",
            "a \"quoted\" word",
            "back\\slash",
            "a line\nand a tab\t",
            "\u{0}\u{1f}\u{7f}",
            "ünïcødé ✓ 𝄞",
            "</script>",
        ]
        .map(String::from)
        .to_vec();
        // Every byte that needs an escape, at every place in and across the 64-byte chunks.
        for special in ['"', '\\', '\n', '\u{0}', '\u{1f}'] {
            for at in [0, 1, 63, 64, 65, 127, 199] {
                let mut text = "x".repeat(200);
                text.replace_range(at..at + 1, &special.to_string());
                texts.push(text);
            }
        }
        for text in &texts {
            assert_eq!(
                written_str(text),
                serde_json::to_vec(text).unwrap(),
                "{text:?}"
            );
        }
    }

    #[test]
    fn numbers_and_ids_are_written_as_serde_json_writes_them() {
        for n in [0i64, 7, -12, i64::MIN, i64::MAX] {
            let mut out = Vec::new();
            push_integer(&mut out, n);
            assert_eq!(out, serde_json::to_vec(&n).unwrap());
        }
        let mut out = Vec::new();
        push_integer(&mut out, u64::MAX);
        assert_eq!(out, serde_json::to_vec(&u64::MAX).unwrap());
        let id = MessageId(uuid::Uuid::from_u128(
            0x0123_4567_89ab_cdef_0123_4567_89ab_cdef,
        ));
        let mut out = Vec::new();
        push_id(&mut out, id);
        assert_eq!(out, serde_json::to_vec(&id.to_string()).unwrap());
    }

    #[test]
    fn a_frame_longer_than_the_kept_buffer_is_written_whole() {
        let long = "y".repeat(3 * KEPT_BUFFER);
        let frame = written(|out| push_str(out, &long), <[u8]>::to_vec);
        assert_eq!(frame, serde_json::to_vec(&long).unwrap());
        let short = written(|out| push_str(out, "z"), <[u8]>::to_vec);
        assert_eq!(short, br#""z""#);
    }
}
