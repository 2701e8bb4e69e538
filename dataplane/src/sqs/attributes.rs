//! SQS message attributes: checked as AWS checks them, kept in the message's frame (so a
//! WebSocket subscriber sees them too, as `"attributes"`), and digested as AWS digests them
//! (`MD5OfMessageAttributes`, which the Java, .NET, Go and Ruby SDKs check).

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use md5::{Digest, Md5};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The most attributes a message may carry.
pub const MAX_ATTRIBUTES: usize = 10;

/// One attribute, in the shape the JSON protocol sends it (and the frame keeps it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attribute {
    #[serde(rename = "DataType")]
    pub data_type: String,
    #[serde(
        rename = "StringValue",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub string_value: Option<String>,
    /// Base64, as the JSON protocol carries bytes.
    #[serde(
        rename = "BinaryValue",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub binary_value: Option<String>,
    /// Reserved by AWS, never used: refused when given.
    #[serde(rename = "StringListValues", default, skip_serializing)]
    pub string_list_values: Option<Vec<String>>,
    #[serde(rename = "BinaryListValues", default, skip_serializing)]
    pub binary_list_values: Option<Vec<String>>,
}

/// A message's attributes by name, in name order (the order the digest takes them in).
pub type Attributes = BTreeMap<String, Attribute>;

/// Why attributes are refused (`InvalidParameterValue`, with this text).
pub fn check(attributes: &Attributes) -> Result<(), String> {
    if attributes.len() > MAX_ATTRIBUTES {
        return Err(format!(
            "Number of message attributes [{}] exceeds the allowed maximum [{MAX_ATTRIBUTES}].",
            attributes.len()
        ));
    }
    for (name, attribute) in attributes {
        check_name(name)?;
        let base = attribute
            .data_type
            .split_once('.')
            .map_or(attribute.data_type.as_str(), |(base, _)| base);
        let custom_ok = attribute
            .data_type
            .split_once('.')
            .is_none_or(|(_, label)| !label.is_empty() && label.len() <= 256);
        if attribute.data_type.len() > 256 || !custom_ok {
            return Err(format!(
                "The message attribute '{name}' has an invalid type."
            ));
        }
        let texts = [Some(&attribute.data_type), attribute.string_value.as_ref()];
        if texts
            .into_iter()
            .flatten()
            .any(|text| !text.chars().all(allowed_in_text))
        {
            return Err(format!(
                "The message attribute '{name}' has characters outside those SQS allows."
            ));
        }
        if attribute.string_list_values.is_some() || attribute.binary_list_values.is_some() {
            return Err(format!(
                "The message attribute '{name}' uses list values, which are reserved."
            ));
        }
        match (base, &attribute.string_value, &attribute.binary_value) {
            ("String", Some(value), None) if !value.is_empty() => {}
            ("Number", Some(value), None) if is_number(value) => {}
            ("Binary", None, Some(value)) if BASE64.decode(value).is_ok_and(|b| !b.is_empty()) => {}
            ("String" | "Number" | "Binary", _, _) => {
                return Err(format!(
                    "The message attribute '{name}' must contain a non-empty value of type \
                     '{base}'."
                ));
            }
            _ => {
                return Err(format!(
                    "The message attribute '{name}' has an invalid message attribute type, the \
                     set of supported type prefixes is Binary, Number, and String."
                ));
            }
        }
    }
    Ok(())
}

pub use qe_shared::sqs::allowed_in_text;

/// AWS's rules for a name: up to 256 of `A-Za-z0-9_-.`, not starting or ending with `.`,
/// without `..`, and not starting with `AWS.` or `Amazon.` (any case).
fn check_name(name: &str) -> Result<(), String> {
    let lower = name.to_ascii_lowercase();
    let valid = !name.is_empty()
        && name.len() <= 256
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        && !name.starts_with('.')
        && !name.ends_with('.')
        && !name.contains("..")
        && !lower.starts_with("aws.")
        && !lower.starts_with("amazon.");
    match valid {
        true => Ok(()),
        false => Err(format!("Message attribute name '{name}' is invalid.")),
    }
}

/// A number as SQS takes one: an optional sign, digits, an optional fraction and exponent.
fn is_number(text: &str) -> bool {
    let text = text.strip_prefix(['-', '+']).unwrap_or(text);
    !text.is_empty() && text.parse::<f64>().is_ok_and(f64::is_finite) && !text.starts_with('.')
}

/// `MD5OfMessageAttributes`: for each attribute in name order, the name, the data type (each
/// as a 4-byte big-endian length and UTF-8), a transport byte (1 for a string value, 2 for
/// binary) and the value (length and bytes), all digested together; hex.
pub fn digest(attributes: &Attributes) -> String {
    let mut bytes = Vec::new();
    let part = |bytes: &mut Vec<u8>, part: &[u8]| {
        bytes.extend_from_slice(&(part.len() as u32).to_be_bytes());
        bytes.extend_from_slice(part);
    };
    for (name, attribute) in attributes {
        part(&mut bytes, name.as_bytes());
        part(&mut bytes, attribute.data_type.as_bytes());
        match (&attribute.string_value, &attribute.binary_value) {
            (Some(value), _) => {
                bytes.push(1);
                part(&mut bytes, value.as_bytes());
            }
            (None, Some(value)) => {
                bytes.push(2);
                part(&mut bytes, &BASE64.decode(value).unwrap_or_default());
            }
            (None, None) => {}
        }
    }
    qe_shared::hex(&Md5::digest(&bytes))
}

/// `MD5OfMessageBody`: hex.
pub fn body_digest(body: &str) -> String {
    qe_shared::hex(&Md5::digest(body.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string(value: &str) -> Attribute {
        Attribute {
            data_type: "String".into(),
            string_value: Some(value.into()),
            binary_value: None,
            string_list_values: None,
            binary_list_values: None,
        }
    }

    #[test]
    fn the_digests_are_the_ones_aws_gives() {
        // MD5("hello"); and one attribute's digest over the bytes AWS's algorithm lays out
        // (the boto3 test checks the same against its own computation, over the wire).
        assert_eq!(body_digest("hello"), "5d41402abc4b2a76b9719d911017c592");
        let mut one = Attributes::new();
        one.insert("a".into(), string("b"));
        // By hand: [0,0,0,1]'a' [0,0,0,6]'String' 1 [0,0,0,1]'b'.
        let mut bytes = vec![0, 0, 0, 1, b'a', 0, 0, 0, 6];
        bytes.extend_from_slice(b"String");
        bytes.extend_from_slice(&[1, 0, 0, 0, 1, b'b']);
        assert_eq!(digest(&one), qe_shared::hex(&Md5::digest(&bytes)));
    }

    #[test]
    fn attributes_are_checked_as_aws_checks_them() {
        let mut attributes = Attributes::new();
        attributes.insert("trace-id".into(), string("x"));
        attributes.insert(
            "n".into(),
            Attribute {
                data_type: "Number.int".into(),
                ..string("-12.5e3")
            },
        );
        assert_eq!(check(&attributes), Ok(()));
        for bad in ["AWS.x", "amazon.x", ".x", "x.", "a..b", "a b", ""] {
            let mut one = Attributes::new();
            one.insert(bad.into(), string("v"));
            assert!(check(&one).is_err(), "{bad:?}");
        }
        let mut wrong = Attributes::new();
        wrong.insert(
            "n".into(),
            Attribute {
                data_type: "Number".into(),
                ..string("ten")
            },
        );
        assert!(check(&wrong).is_err());
        let mut wrong = Attributes::new();
        wrong.insert(
            "t".into(),
            Attribute {
                data_type: "Date".into(),
                ..string("x")
            },
        );
        assert!(check(&wrong).is_err());
        let many: Attributes = (0..11).map(|n| (format!("a{n}"), string("v"))).collect();
        assert!(check(&many).is_err());
    }
}
