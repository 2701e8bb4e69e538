//! Replies: every one has a `status`; a failure also has a `code` and a `reason`.

use crate::engine::MessageId;
use crate::message::json;
use bytes::Bytes;
use qe_shared::Code;
use serde_json::{Map, Value};
use std::borrow::Cow;

/// A reply. The fields every hot reply has (a publish's, an ack's) are typed, so building and
/// writing one allocates only its frame; the rarer replies' other fields go in a map. Written,
/// the fields are in the order of their names, as a JSON map of them all would be.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    status: &'static str,
    failure: Option<(Code, Cow<'static, str>)>,
    id: Option<MessageId>,
    context: Option<Context>,
    /// Any other fields (an empty map allocates nothing).
    other: Map<String, Value>,
}

/// A request's `context`, to copy into its reply.
#[derive(Debug, Clone, PartialEq)]
pub enum Context {
    /// A whole number that fits 64 bits, written back as the same digits.
    Integer(i64),
    /// Any other number, or a text.
    Value(Value),
}

impl Reply {
    pub fn success() -> Reply {
        Reply::with_status("Success.")
    }

    pub fn logout() -> Reply {
        Reply::with_status("Logout Success.")
    }

    pub fn failure(code: Code) -> Reply {
        Reply::success().into_failure(code)
    }

    /// A failure whose reason names the particular (the manual's 414 and 415 do).
    pub fn failure_because(code: Code, reason: String) -> Reply {
        Reply {
            status: "Failure.",
            failure: Some((code, reason.into())),
            ..Reply::success()
        }
    }

    /// This reply, with its other fields, as the failure `code`.
    pub fn into_failure(self, code: Code) -> Reply {
        Reply {
            status: "Failure.",
            failure: Some((code, code.reason().into())),
            ..self
        }
    }

    fn with_status(status: &'static str) -> Reply {
        Reply {
            status,
            failure: None,
            id: None,
            context: None,
            other: Map::new(),
        }
    }

    /// The message the reply speaks of.
    pub fn with_id(self, id: MessageId) -> Reply {
        Reply {
            id: Some(id),
            ..self
        }
    }

    /// Another field. Not one of the typed ones (`status`, `code`, `reason`, `id`,
    /// `context`), which have their own setters.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Reply {
        debug_assert!(!["status", "code", "reason", "id", "context"].contains(&key));
        self.other.insert(key.to_string(), value.into());
        self
    }

    /// Copies the request's context, if it had one.
    pub fn context(self, context: Option<impl Into<Context>>) -> Reply {
        Reply {
            context: context.map(Into::into),
            ..self
        }
    }

    pub fn code(&self) -> Option<u64> {
        self.failure
            .as_ref()
            .map(|(code, _)| u64::from(code.number()))
    }

    /// The reply's frame, for the socket at once: a typed reply's is cut from a block that
    /// it keeps while it lives ([`json::written_passing`]).
    pub fn to_frame(&self) -> Bytes {
        if self.other.is_empty() {
            return json::written_passing(|out| self.write_typed(out));
        }
        serde_json::to_vec(&self.as_map())
            .expect("a map of JSON values serializes")
            .into()
    }

    /// Writes the typed fields, in the order of their names (by hand: this runs for every
    /// publish and ack). Every field is written after a comma, each key with it as one
    /// literal, and the first comma then becomes the brace.
    fn write_typed(&self, out: &mut Vec<u8>) {
        let start = out.len();
        if let Some((code, _)) = &self.failure {
            out.extend_from_slice(br#","code":"#);
            json::push_integer(out, code.number());
        }
        if let Some(context) = &self.context {
            out.extend_from_slice(br#","context":"#);
            match context {
                Context::Integer(n) => json::push_integer(out, *n),
                Context::Value(value) => json::push_value(out, value),
            }
        }
        if let Some(id) = self.id {
            out.extend_from_slice(br#","id":"#);
            json::push_id(out, id);
        }
        if let Some((_, reason)) = &self.failure {
            out.extend_from_slice(br#","reason":"#);
            json::push_str(out, reason);
        }
        // One of this module's own texts, none of which needs an escape.
        debug_assert!(json::is_plain_text(self.status.as_bytes()));
        out.extend_from_slice(br#","status":""#);
        out.extend_from_slice(self.status.as_bytes());
        out.extend_from_slice(br#""}"#);
        out[start] = b'{';
    }

    /// All the fields as one JSON map, for a reply with fields beyond the typed ones.
    fn as_map(&self) -> Map<String, Value> {
        let mut fields = self.other.clone();
        fields.insert("status".into(), self.status.into());
        if let Some((code, reason)) = &self.failure {
            fields.insert("code".into(), code.number().into());
            fields.insert("reason".into(), reason.as_ref().into());
        }
        if let Some(id) = &self.id {
            fields.insert("id".into(), id.to_string().into());
        }
        match &self.context {
            Some(Context::Integer(n)) => _ = fields.insert("context".into(), (*n).into()),
            Some(Context::Value(value)) => _ = fields.insert("context".into(), value.clone()),
            None => {}
        }
        fields
    }
}

impl From<Value> for Context {
    fn from(value: Value) -> Context {
        Context::Value(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ID: MessageId = MessageId(uuid::Uuid::from_u128(
        0x01a1c09f_62da_7000_a30b_0817c9a42e3f,
    ));

    #[test]
    fn replies_look_like_the_manuals() {
        let text = |r: Reply| String::from_utf8(r.to_frame().to_vec()).unwrap();
        assert_eq!(
            text(Reply::failure(Code::InvalidDelay)),
            r#"{"code":203,"reason":"Invalid delay.","status":"Failure."}"#
        );
        assert_eq!(
            text(Reply::success().with_id(ID).context(Some(json!(7)))),
            format!(r#"{{"context":7,"id":"{ID}","status":"Success."}}"#)
        );
        assert_eq!(text(Reply::logout()), r#"{"status":"Logout Success."}"#);
        assert_eq!(
            text(
                Reply::success()
                    .with_id(ID)
                    .context(Some(json!(7)))
                    .into_failure(Code::SyncFailed)
            ),
            text(
                Reply::failure(Code::SyncFailed)
                    .with_id(ID)
                    .context(Some(json!(7)))
            )
        );
    }

    #[test]
    fn typed_fields_are_written_as_a_map_of_them_would_be() {
        let replies = [
            Reply::success(),
            Reply::failure(Code::InvalidDelay).context(Some(json!("a \"quoted\" context"))),
            Reply::success()
                .with_id(ID)
                .context(Some(Context::Integer(-12))),
            Reply::success().context(Some(json!(1.5))),
            Reply::failure_because(Code::InvalidDelay, "a reason\nwith a line".into()).with_id(ID),
        ];
        for reply in replies {
            let typed = reply.to_frame();
            let map = serde_json::to_vec(&reply.as_map()).unwrap();
            assert_eq!(typed, map, "{reply:?}");
        }
        let long = Reply::success().context(Some(json!("x".repeat(300))));
        assert_eq!(long.to_frame(), serde_json::to_vec(&long.as_map()).unwrap());
        let other = Reply::failure(Code::InvalidDelay)
            .with("csv", "a,b")
            .with_id(ID);
        let written: Value = serde_json::from_slice(&other.to_frame()).unwrap();
        assert_eq!(written["csv"], "a,b");
        assert_eq!(written["code"], 203);
        assert_eq!(written["id"], ID.to_string());
    }
}
