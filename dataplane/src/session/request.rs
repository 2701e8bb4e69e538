//! Reading a request: JSON, its `context`, and the shapes of field values.
//!
//! A request is read one of two ways. The hot requests (a publish, an ack) are first read
//! straight into a typed struct that borrows from the frame ([`typed`]), which allocates
//! nothing for the fields; that succeeds only when every field present has its type and the
//! context is a plain one, and then the request means exactly what the general reading would
//! make of it. Anything else (a wrong type, a repeated field, escapes where a borrow is
//! needed, a context with a fraction) is read the general way, into a map of JSON values
//! ([`parse`]), whose checks give each fault its code.
//!
//! Before the typed reading, the usual shape of a publish or an ack (a flat object of plain
//! texts and whole numbers) is read by hand (`flat`), which costs less again; whatever it
//! does not read goes on to the typed reading.

use super::reply::Context;
use qe_shared::protocol::MAX_CONTEXT_BYTES;
use qe_shared::Code;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::borrow::Cow;

/// A request's fields.
pub type Fields = Map<String, Value>;

/// What a text frame holds.
pub enum Parsed {
    /// A JSON object: a request.
    Object(Fields),
    /// JSON, but not an object (`[1]`, `42`, `"q"`).
    OtherJson,
    /// Not JSON at all.
    NotJson,
}

pub fn parse(text: &str) -> Parsed {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(fields)) => Parsed::Object(fields),
        Ok(_) => Parsed::OtherJson,
        Err(_) => Parsed::NotJson,
    }
}

/// A field of a request as it was sent: absent, of its type, or of another type.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Field<T> {
    #[default]
    Absent,
    Is(T),
    /// Present with another type (only from the general reading; the typed one fails).
    Wrong,
}

/// Read typed, a present field must have its type (`null` too is another type).
impl<'de, T: Deserialize<'de>> Deserialize<'de> for Field<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        T::deserialize(deserializer).map(Field::Is)
    }
}

impl<T> Field<T> {
    pub fn is_absent(&self) -> bool {
        matches!(self, Field::Absent)
    }
}

/// A text field, borrowed from the frame unless it holds escapes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Text<'a>(pub Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(text)))
            }
            fn visit_str<E>(self, text: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(text.to_string())))
            }
            fn visit_string<E>(self, text: String) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(text)))
            }
        }
        deserializer.deserialize_str(Visitor)
    }
}

/// The typed reading of a request, `None` when it must be read the general way.
pub fn typed<'a, T: Deserialize<'a>>(text: &'a str) -> Option<T> {
    // A derived struct reads a JSON array too, field by field: only an object is a request.
    if !text.trim_start().starts_with('{') {
        return None;
    }
    serde_json::from_str(text).ok()
}

/// A context read typed: `Some` with what to copy into the reply when it is absent, a whole
/// number that fits 64 bits, or a text without escapes; `None` when only the general
/// reading can say (a fraction, an exponent, `-0`, an escape, another type, too long).
pub fn typed_context(context: &Field<&RawValue>) -> Option<Option<Context>> {
    let raw = match context {
        Field::Absent => return Some(None),
        Field::Is(raw) => raw.get(),
        Field::Wrong => return None,
    };
    if let Some(inner) = raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
        return (!inner.contains('\\'))
            .then(|| text_context(inner))?
            .map(Some);
    }
    integer_context(raw).map(Some)
}

/// A context that is a text without escapes (`inner`, between its quotes), read typed;
/// `None` when it is too long.
pub fn text_context(inner: &str) -> Option<Context> {
    (inner.len() <= MAX_CONTEXT_BYTES).then(|| Context::Value(Value::String(inner.to_string())))
}

/// A context that is a JSON number (`raw`, as written), read typed: a whole number that fits
/// 64 bits, but -0; `None` for any other.
pub fn integer_context(raw: &str) -> Option<Context> {
    // JSON has no leading zeros, so every integer but -0 is written as i64 writes it.
    let integer = raw != "-0" && raw.bytes().all(|b| b.is_ascii_digit() || b == b'-');
    let number = integer.then(|| raw.parse::<i64>().ok()).flatten()?;
    Some(Context::Integer(number))
}

/// A number field of the general reading: a JSON integer of zero or more, or another type.
pub fn number_field(fields: &Fields, key: &str) -> Field<u64> {
    match fields.get(key) {
        None => Field::Absent,
        Some(value) => whole_number(value).map_or(Field::Wrong, Field::Is),
    }
}

/// A text field of the general reading, taken out of the map.
pub fn text_field(fields: &mut Fields, key: &str) -> Field<Text<'static>> {
    match fields.remove(key) {
        None => Field::Absent,
        Some(Value::String(text)) => Field::Is(Text(Cow::Owned(text))),
        Some(_) => Field::Wrong,
    }
}

/// A number field within `range`: its value, or `code` if it is present and anything else.
pub fn number_in(
    field: Field<u64>,
    range: std::ops::RangeInclusive<u64>,
    code: Code,
) -> Result<Option<u64>, Code> {
    match field {
        Field::Absent => Ok(None),
        Field::Is(n) if range.contains(&n) => Ok(Some(n)),
        _ => Err(code),
    }
}

/// The request's `context`, to copy into the reply: a number, or a text of up to 256 bytes.
pub fn context(fields: &Fields) -> Result<Option<Value>, Code> {
    match fields.get("context") {
        None => Ok(None),
        Some(number @ Value::Number(_)) => Ok(Some(number.clone())),
        Some(Value::String(text)) if text.len() <= MAX_CONTEXT_BYTES => {
            Ok(Some(Value::String(text.clone())))
        }
        Some(_) => Err(Code::InvalidContext),
    }
}

/// A JSON integer of zero or more. Fractions (`1.0` too), strings and booleans are not.
pub fn whole_number(value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64(),
        _ => None,
    }
}

/// An optional whole-number field within `range`; `code` if it is present and anything else.
pub fn optional_number_in(
    fields: &Fields,
    key: &str,
    range: std::ops::RangeInclusive<u64>,
    code: Code,
) -> Result<Option<u64>, Code> {
    number_in(number_field(fields, key), range, code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(value: Value) -> Fields {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn context_is_a_number_or_a_short_text() {
        assert_eq!(context(&fields(json!({"context": 7}))), Ok(Some(json!(7))));
        assert_eq!(
            context(&fields(json!({"context": -2.5}))),
            Ok(Some(json!(-2.5)))
        );
        let text = "x".repeat(256);
        assert_eq!(
            context(&fields(json!({"context": text}))),
            Ok(Some(json!(text)))
        );
        for bad in [
            json!("x".repeat(257)),
            json!(true),
            json!(null),
            json!([1]),
            json!({}),
        ] {
            assert_eq!(
                context(&fields(json!({"context": bad}))),
                Err(Code::InvalidContext)
            );
        }
        assert_eq!(context(&fields(json!({}))), Ok(None));
    }

    #[test]
    fn a_number_context_comes_back_as_the_same_number() {
        // Every digit is kept; only an exponent's spelling is normalized (1e400 → 1e+400).
        for (text, echo) in [
            ("12345678901234567890123", "12345678901234567890123"),
            ("1.50", "1.50"),
            ("-0", "-0"),
            ("1e400", "1e+400"),
        ] {
            let parsed = match parse(&format!(r#"{{"context":{text}}}"#)) {
                Parsed::Object(fields) => fields,
                _ => panic!("{text}"),
            };
            let echoed = serde_json::to_string(&context(&parsed).unwrap().unwrap()).unwrap();
            assert_eq!(echoed, echo);
        }
    }

    #[test]
    fn whole_numbers_are_json_integers_only() {
        assert_eq!(whole_number(&json!(3)), Some(3));
        for not in [json!(1.0), json!(-1), json!("1"), json!(true), json!(1e3)] {
            assert_eq!(whole_number(&not), None, "{not}");
        }
    }
}
