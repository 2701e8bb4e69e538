//! Replies: every one has a `status`; a failure also has a `code` and a `reason`.

use bytes::Bytes;
use qe_shared::Code;
use serde_json::{Map, Value};

#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    fields: Map<String, Value>,
}

impl Reply {
    pub fn success() -> Reply {
        Reply::with_status("Success.")
    }

    pub fn logout() -> Reply {
        Reply::with_status("Logout Success.")
    }

    pub fn failure(code: Code) -> Reply {
        Reply::with_status("Failure.")
            .with("code", code.number())
            .with("reason", code.reason())
    }

    /// A failure whose reason names the particular (the manual's 414 and 415 do).
    pub fn failure_because(code: Code, reason: String) -> Reply {
        Reply::with_status("Failure.")
            .with("code", code.number())
            .with("reason", reason)
    }

    /// This reply, with its other fields, as the failure `code`.
    pub fn into_failure(self, code: Code) -> Reply {
        self.with("status", "Failure.")
            .with("code", code.number())
            .with("reason", code.reason())
    }

    fn with_status(status: &str) -> Reply {
        Reply { fields: Map::new() }.with("status", status)
    }

    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Reply {
        self.fields.insert(key.to_string(), value.into());
        self
    }

    /// Copies the request's context, if it had one.
    pub fn context(self, context: Option<Value>) -> Reply {
        match context {
            Some(context) => self.with("context", context),
            None => self,
        }
    }

    pub fn code(&self) -> Option<u64> {
        self.fields.get("code").and_then(Value::as_u64)
    }

    pub fn to_frame(&self) -> Bytes {
        serde_json::to_vec(&self.fields)
            .expect("a map of JSON values serializes")
            .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_look_like_the_manuals() {
        let text = |r: Reply| String::from_utf8(r.to_frame().to_vec()).unwrap();
        assert_eq!(
            text(Reply::failure(Code::InvalidDelay)),
            r#"{"code":203,"reason":"Invalid delay.","status":"Failure."}"#
        );
        assert_eq!(
            text(Reply::success().with("id", "x").context(Some(7.into()))),
            r#"{"context":7,"id":"x","status":"Success."}"#
        );
        assert_eq!(text(Reply::logout()), r#"{"status":"Logout Success."}"#);
        assert_eq!(
            text(
                Reply::success()
                    .with("id", "x")
                    .context(Some(7.into()))
                    .into_failure(Code::SyncFailed)
            ),
            text(
                Reply::failure(Code::SyncFailed)
                    .with("id", "x")
                    .context(Some(7.into()))
            )
        );
    }
}
