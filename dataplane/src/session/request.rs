//! Reading a request: JSON, its `context`, and the shapes of field values.

use qe_shared::protocol::MAX_CONTEXT_BYTES;
use qe_shared::Code;
use serde_json::{Map, Value};

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
    match fields.get(key) {
        None => Ok(None),
        Some(value) => whole_number(value)
            .filter(|n| range.contains(n))
            .map(Some)
            .ok_or(code),
    }
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
