//! The usual shape of the hot requests, read by hand: a flat JSON object whose keys are
//! texts without escapes and whose values are texts without escapes or whole numbers, as a
//! publish and an ack nearly always are. serde's typed reading of a publish and its ack was
//! the biggest single item of the node's own work per message at 16 × 16 (about 3,000 of
//! 15,300 instructions, counted by valgrind); reading them here takes about 5% of a message's
//! instructions off (docs/performance.md).
//!
//! Anything else (an escape, a nested value, a fraction, `true`, a repeated key) is not read
//! here (`None`) and goes on to the typed reading (see `request`). So this reads only texts
//! the typed reading reads too, and makes the same of them: checked by
//! `typed_reading::agrees`, its tests and the `requests` fuzz target.

use super::reply::Context;
use super::request::{self, Field};
use crate::message::json::first_to_escape;

/// A member's value, as it stands in the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plain<'a> {
    /// A text without escapes or control characters: what is between its quotes.
    Text(&'a str),
    /// A whole number as JSON writes one (`-`, then `0` or digits not starting with `0`).
    Integer(&'a str),
}

/// Hands `member` each member of the flat object `text`, in order; `None` if `text` is not
/// one, or as soon as `member` says `None` (a key it does not take, a value of another type).
pub fn read<'a>(
    text: &'a str,
    mut member: impl FnMut(&'a str, Plain<'a>) -> Option<()>,
) -> Option<()> {
    let mut at = Reader { text, at: 0 };
    at.skip_space();
    at.expect(b'{')?;
    at.skip_space();
    if at.peek() == Some(b'}') {
        at.at += 1;
        return at.end();
    }
    loop {
        let key = at.text()?;
        at.skip_space();
        at.expect(b':')?;
        at.skip_space();
        let value = match at.peek()? {
            b'"' => Plain::Text(at.text()?),
            _ => Plain::Integer(at.integer()?),
        };
        member(key, value)?;
        at.skip_space();
        match at.peek()? {
            b',' => {
                at.at += 1;
                at.skip_space();
            }
            b'}' => {
                at.at += 1;
                return at.end();
            }
            _ => return None,
        }
    }
}

/// Sets a field read here; `None` if it was set already (a repeated key, which the typed
/// reading refuses).
pub fn set<T>(field: &mut Field<T>, value: T) -> Option<()> {
    field.is_absent().then(|| *field = Field::Is(value))
}

/// A request's `context` read here, as the typed reading makes it: `None` when only the
/// general reading can say.
pub fn context(value: Plain<'_>) -> Option<Context> {
    match value {
        Plain::Text(text) => request::text_context(text),
        Plain::Integer(raw) => request::integer_context(raw),
    }
}

/// A place in the text. Every byte it stops at or after is ASCII, so every slice it takes
/// is on a character boundary.
struct Reader<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Reader<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// JSON's whitespace.
    fn skip_space(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    /// Nothing but whitespace is left.
    fn end(&mut self) -> Option<()> {
        self.skip_space();
        (self.at == self.text.len()).then_some(())
    }

    /// A text without escapes or control characters (what serde would borrow as it is).
    fn text(&mut self) -> Option<&'a str> {
        self.expect(b'"')?;
        let rest = &self.text[self.at..];
        let length = plain_text_length(rest.as_bytes())?;
        self.at += length + 1;
        Some(&rest[..length])
    }

    /// A whole number as JSON writes one; `None` for a fraction or an exponent.
    fn integer(&mut self) -> Option<&'a str> {
        let bytes = self.text.as_bytes();
        let start = self.at;
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        let digits = self.at;
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.at += 1;
        }
        let count = self.at - digits;
        let leading_zero = count > 1 && bytes[digits] == b'0';
        let fraction = matches!(self.peek(), Some(b'.' | b'e' | b'E'));
        (count > 0 && !leading_zero && !fraction).then(|| &self.text[start..self.at])
    }
}

/// Where the text that `bytes` begin ends (at its closing quote), if nothing in it needs an
/// escape: `None` at a backslash or a control character, or without a closing quote.
fn plain_text_length(bytes: &[u8]) -> Option<usize> {
    let end = first_to_escape(bytes)?;
    (bytes[end] == b'"').then_some(end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(text: &str) -> Option<Vec<(&str, Plain<'_>)>> {
        let mut all = Vec::new();
        read(text, |key, value| {
            all.push((key, value));
            Some(())
        })?;
        Some(all)
    }

    #[test]
    fn a_flat_object_is_read_member_by_member() {
        use Plain::{Integer, Text};
        assert_eq!(members("{}"), Some(vec![]));
        assert_eq!(members(" \r\n\t{ } \n"), Some(vec![]));
        assert_eq!(
            members(r#"{"body":"ünï ✓","durability":0,"context":-12}"#),
            Some(vec![
                ("body", Text("ünï ✓")),
                ("durability", Integer("0")),
                ("context", Integer("-12")),
            ])
        );
        assert_eq!(
            members(r#"{ "body" : "a b" , "delay": 120 }"#),
            Some(vec![("body", Text("a b")), ("delay", Integer("120"))])
        );
        assert_eq!(members(r#"{"":""}"#), Some(vec![("", Text(""))]));
    }

    #[test]
    fn a_text_ends_at_its_quote_wherever_that_is() {
        for length in 0..40 {
            for filler in ["a", "ü", "\u{7f}"] {
                let text = filler.repeat(length);
                let quoted = format!("{text}\" tail");
                assert_eq!(plain_text_length(quoted.as_bytes()), Some(text.len()));
                for (special, at) in [
                    ("\\", 0),
                    ("\n", 1),
                    ("\u{1f}", 7),
                    ("\\", 8),
                    ("\u{0}", 20),
                ] {
                    if at > text.len() {
                        continue;
                    }
                    let mut broken = text.clone();
                    let at = broken
                        .char_indices()
                        .nth(at)
                        .map_or(broken.len(), |(i, _)| i);
                    broken.insert_str(at, special);
                    let quoted = format!("{broken}\"");
                    assert_eq!(plain_text_length(quoted.as_bytes()), None, "{quoted:?}");
                }
                assert_eq!(plain_text_length(text.as_bytes()), None, "no quote");
            }
        }
    }

    #[test]
    fn anything_else_is_left_to_the_typed_reading() {
        for text in [
            "",
            "{",
            "[]",
            r#"{"a":1"#,
            r#"{"a":1,}"#,
            r#"{"a":1}x"#,
            r#"{"a":1}{}"#,
            r#"{"a" 1}"#,
            r#"{a:1}"#,
            r#"{"a":"b\"c"}"#,
            r#"{"a":"b\\c"}"#,
            r#"{"a\u0062":1}"#,
            "{\"a\":\"tab\there\"}",
            r#"{"a":1.5}"#,
            r#"{"a":1e3}"#,
            r#"{"a":1E3}"#,
            r#"{"a":01}"#,
            r#"{"a":-01}"#,
            r#"{"a":-}"#,
            r#"{"a":+1}"#,
            r#"{"a":true}"#,
            r#"{"a":null}"#,
            r#"{"a":{}}"#,
            r#"{"a":[1]}"#,
            r#"{"a":"unterminated}"#,
            "\u{a0}{}",
        ] {
            assert_eq!(members(text), None, "{text:?}");
        }
        // What `member` refuses ends the reading.
        assert_eq!(
            read(r#"{"a":1,"b":2}"#, |key, _| (key == "a").then_some(())),
            None
        );
    }
}
