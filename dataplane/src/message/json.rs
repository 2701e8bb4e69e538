//! JSON written by hand into a frame's bytes. Every message's delivery frame and every publish
//! and ack reply are written here, where serde's and `fmt`'s general machinery (a call through
//! `dyn Write` for each piece, a formatter for each number) cost more than the writing. What is
//! written is exactly what `serde_json` writes for the same values (see the tests).

use super::ids::MessageId;
use bytes::{Bytes, BytesMut};
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

/// A block that replies are cut from; one reply is a few dozen bytes.
const REPLY_BLOCK: usize = 16 << 10;

/// What `write` writes, as a frame that lives only until the connection has copied it into
/// its socket's buffer, as every reply does: cut from a block the thread keeps, where an
/// allocation of its own was two of the five allocations a message makes at 16 × 16
/// (docs/performance.md). A block is taken up again once every frame cut from it is gone,
/// so a frame kept for long would keep its whole block: nothing but passing frames come
/// from here. A frame bigger than a quarter of a block gets an allocation of its own.
pub fn written_passing(write: impl FnOnce(&mut Vec<u8>)) -> Bytes {
    thread_local! {
        static BLOCK: RefCell<BytesMut> = RefCell::new(BytesMut::new());
    }
    let cut = |frame: &[u8]| {
        BLOCK.with(|block| match block.try_borrow_mut() {
            Ok(mut block) if frame.len() <= REPLY_BLOCK / 4 => {
                if block.capacity() < frame.len() {
                    // The same block again if nothing cut from it is left, else a new one.
                    block.reserve(REPLY_BLOCK);
                }
                block.extend_from_slice(frame);
                block.split().freeze()
            }
            _ => Bytes::copy_from_slice(frame),
        })
    };
    written(write, cut)
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
/// Every publish's texts are looked through here, and every delivery frame's body again, so
/// sixteen bytes are looked at a time where the build has SSE2 (every x86-64 target but a
/// few bare-metal ones), and eight elsewhere and in texts shorter than sixteen bytes.
pub fn first_to_escape(bytes: &[u8]) -> Option<usize> {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    let start = match sixteen_at_a_time(bytes) {
        Ok(found) => return Some(found),
        Err(looked_through) => looked_through,
    };
    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
    let start = 0;
    eight_at_a_time(bytes, start)
}

/// The first byte to escape (`Ok`), or how many bytes were looked through without one
/// (`Err`: all of them, or, when there are fewer than sixteen, none).
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
fn sixteen_at_a_time(bytes: &[u8]) -> Result<usize, usize> {
    let first_in_block = |at: usize| {
        let block: &[u8; 16] = bytes[at..at + 16].try_into().expect("16 bytes");
        let found = to_escape_in(block);
        (found != 0).then(|| at + found.trailing_zeros() as usize)
    };
    let mut start = 0;
    while start + 16 <= bytes.len() {
        if let Some(found) = first_in_block(start) {
            return Ok(found);
        }
        start += 16;
    }
    if start == bytes.len() || bytes.len() < 16 {
        return Err(start);
    }
    // The last few bytes, in the block that ends where they do: the bytes it looks at again
    // were plain, so what it finds is one of the last few.
    first_in_block(bytes.len() - 16).ok_or(bytes.len())
}

/// One bit for each byte of `block` that needs an escape.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
fn to_escape_in(block: &[u8; 16]) -> u32 {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8, _mm_or_si128,
        _mm_set1_epi8,
    };
    // SAFETY: this is built with SSE2 (the cfg: every x86-64 target has it but a few
    // bare-metal ones), and the load (unaligned) reads the sixteen bytes of `block`.
    unsafe {
        let block = _mm_loadu_si128(block.as_ptr().cast::<__m128i>());
        let quote = _mm_cmpeq_epi8(block, _mm_set1_epi8(b'"' as i8));
        let backslash = _mm_cmpeq_epi8(block, _mm_set1_epi8(b'\\' as i8));
        // A control character is at most 0x1f: the byte is then its own minimum with 0x1f.
        let control = _mm_cmpeq_epi8(_mm_min_epu8(block, _mm_set1_epi8(0x1f)), block);
        _mm_movemask_epi8(_mm_or_si128(_mm_or_si128(quote, backslash), control)) as u32
    }
}

/// The first byte to escape from `start` on, eight bytes at a time.
fn eight_at_a_time(bytes: &[u8], mut start: usize) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    // A high bit set in each byte that is zero (and, past the first such, maybe others).
    let zero_bytes = |word: u64| word.wrapping_sub(ONES) & !word & HIGH;
    for chunk in bytes[start..].chunks_exact(8) {
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

    /// The first byte to escape, one byte at a time: what the blocks must find.
    fn first_to_escape_plainly(bytes: &[u8]) -> Option<usize> {
        bytes
            .iter()
            .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
    }

    #[test]
    fn every_byte_value_is_found_or_passed_at_every_place_in_and_after_the_blocks() {
        for length in 0..70 {
            for at in 0..length {
                for byte in 0..=255u8 {
                    let mut bytes = vec![b'x'; length];
                    bytes[at] = byte;
                    let expected = first_to_escape_plainly(&bytes);
                    assert_eq!(
                        first_to_escape(&bytes),
                        expected,
                        "{byte:#x} at {at} of {length}"
                    );
                    assert_eq!(eight_at_a_time(&bytes, 0), expected, "{byte:#x} at {at}");
                }
            }
        }
        // The first of several, in the first block, a later one and the last few bytes; and
        // bytes above 0x7f (UTF-8), which are never escaped.
        let bytes = "é\"a\\\n".repeat(9);
        assert_eq!(first_to_escape(bytes.as_bytes()), Some(2));
        for length in 17..70 {
            for first in 0..length {
                let mut bytes = vec![b'x'; length];
                let special = [b'"', b'\\', 0x1f].iter().cycle();
                for (byte, to) in bytes[first..].iter_mut().step_by(5).zip(special) {
                    *byte = *to;
                }
                assert_eq!(first_to_escape(&bytes), Some(first), "{first} of {length}");
            }
        }
        let plain = "ünïcødé ✓ 𝄞 ".repeat(5);
        assert_eq!(first_to_escape(plain.as_bytes()), None);
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
    fn passing_frames_are_cut_from_one_block_and_it_is_taken_up_again_when_they_are_gone() {
        // Each test runs on a thread of its own, so this one's block is new.
        let frame = |text: &str| written_passing(|out| push_str(out, text));
        let quarter = "q".repeat(REPLY_BLOCK / 4 - 2); // with its quotes, a quarter block
        let first = frame("one");
        let second = frame("two");
        assert_eq!(
            (&first[..], &second[..]),
            (&br#""one""#[..], &br#""two""#[..])
        );
        assert_eq!(second.as_ptr(), first.as_ptr().wrapping_add(first.len()));
        let start = first.as_ptr();
        drop((first, second));
        for _ in 0..3 {
            drop(frame(&quarter));
        }
        // The block has 10 bytes short of a quarter left, and nothing cut from it is alive.
        let again = frame(&quarter);
        assert_eq!(again.as_ptr(), start, "the block is taken up again");
        // A frame bigger than a quarter of a block is not cut from it.
        let big = frame(&"b".repeat(REPLY_BLOCK / 2));
        assert_eq!(big.len(), REPLY_BLOCK / 2 + 2);
        let after = frame("after");
        assert_eq!(after.as_ptr(), again.as_ptr().wrapping_add(again.len()));
        // With a frame of it alive, a full block is not taken up again: a new one is, and
        // the frame keeps its bytes.
        let kept = frame("kept");
        let fill: Vec<Bytes> = (0..3).map(|_| frame(&quarter)).collect();
        let next = frame(&quarter);
        assert_eq!(&kept[..], br#""kept""#);
        assert!(fill.iter().all(|f| f.len() == REPLY_BLOCK / 4));
        assert_ne!(
            next.as_ptr(),
            start,
            "a new block while one of the old is alive"
        );
        assert_eq!(next.len(), REPLY_BLOCK / 4);
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
