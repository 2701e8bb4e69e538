//! The promise of the typed reading (see `request`): whenever it reads a request, the
//! general reading makes the same of it. Checked by the unit tests below over the requests
//! that matter and by the `requests` fuzz target over any text.

use super::reply::{Context, Reply};
use super::request::{self, number_field, Parsed};
use super::{read_ack_typed, read_message, read_typed};
use qe_shared::protocol::QueueType;
use serde_json::Value;

/// Whether the typed reading of `text`, as a publish on both queue types and as an ack,
/// agrees with the general reading wherever it reads it; the disagreement if not.
pub fn agrees(text: &str) -> Result<(), String> {
    let general = match request::parse(text) {
        Parsed::Object(fields) => Some(fields),
        _ => None,
    };
    let general_context = general.as_ref().map(request::context);
    for queue_type in [QueueType::Distribute, QueueType::Copy] {
        let Some((typed, typed_context)) = read_typed(text, queue_type) else {
            continue;
        };
        let (Some(fields), Some(Ok(context))) = (&general, &general_context) else {
            return Err(format!(
                "typed read a publish the general reading refuses: {text}"
            ));
        };
        if typed != read_message(fields.clone(), queue_type) {
            return Err(format!("the publish reads differently: {text}"));
        }
        same_context(&typed_context, context, text)?;
    }
    if let Some(ack) = read_ack_typed(text) {
        let (Some(fields), Some(Ok(context))) = (&general, &general_context) else {
            return Err(format!(
                "typed read an ack the general reading refuses: {text}"
            ));
        };
        let only_ack = !fields.contains_key("logout") && !fields.contains_key("capacity");
        let id = fields.get("id").and_then(Value::as_str);
        if !only_ack || ack.ack != number_field(fields, "ack") || ack.id != id {
            return Err(format!("the ack reads differently: {text}"));
        }
        same_context(&ack.context, context, text)?;
    }
    Ok(())
}

/// Both readings' contexts come back the same in a reply.
fn same_context(
    typed: &Option<Context>,
    general: &Option<Value>,
    text: &str,
) -> Result<(), String> {
    let typed = Reply::success().context(typed.clone()).to_frame();
    let general = Reply::success().context(general.clone()).to_frame();
    match typed == general {
        true => Ok(()),
        false => Err(format!("the context comes back differently: {text}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_typed_reading_means_what_the_general_one_does() {
        let requests = [
            r#"{"body":"hello"}"#,
            r#"{"body":"hello","durability":2,"context":17}"#,
            r#"{"body":"he said \"hi\"","context":"a"}"#,
            r#"{"body":"aGk=","type":2,"delay":60,"publisherkey":"k-1"}"#,
            r#"{"body":"!!","type":2,"delay":"x"}"#,
            r#"{"body":"x","type":3}"#,
            r#"{"body":"x","delay":172801}"#,
            r#"{"body":"x","durability":null}"#,
            r#"{"body":"x","durability":1.0}"#,
            r#"{"body":"x","body":"y"}"#,
            r#"{"body":"x","publisherkey":"a b"}"#,
            r#"{"delay":5}"#,
            r#"{"body":"x","context":-0}"#,
            r#"{"body":"x","context":1e400}"#,
            r#"{"body":"x","context":12345678901234567890123}"#,
            r#"{"body":"x","context":-9223372036854775808}"#,
            r#"{"body":"x","context":null}"#,
            r#"{"body":"x","context":"with \n escape"}"#,
            r#"{"id":"01a1c09f-62da-7000-a30b-0817c9a42e3f","ack":1}"#,
            r#"{"id":"01a1c09f-62da-7000-a30b-0817c9a42e3f","ack":0,"context":3}"#,
            r#"{"id":"01a1c09f-62da-7000-a30b-0817c9a42e3f","ack":2}"#,
            r#"{"id":5,"ack":1}"#,
            r#"{"ack":1}"#,
            r#"{"ack":1,"logout":true}"#,
            r#"{"ack":1,"capacity":null}"#,
            r#"{"id":"\u0030","ack":1}"#,
            r#"[1]"#,
            // Found by fuzzing: serde skips an unknown field's lone surrogate unchecked.
            r#"{"durbaility":2,"contex:":"ddddddy\udb0adddddddt"}"#,
            r#"{"body":"x","other":"\udb0a"}"#,
            r#"{"ack":1,"id":"01a1c09f-62da-7000-a30b-0817c9a42e3f","x":"\udb0a"}"#,
            r#"{"body":"x","context":"\udb0a"}"#,
            r#"not json"#,
            // The shapes read by hand (`flat`), and their edges.
            r#"{"body":"x","durability":2,"context":7}"#,
            r#"{ "body" : "x" ,"durability":0 , "context":"c" }"#,
            "\n{\"body\":\"x\"}\t",
            r#"{"body":"x","durability":-0}"#,
            r#"{"body":"x","durability":18446744073709551616}"#,
            r#"{"body":"x","delay":01}"#,
            r#"{"body":"x","context":-0}"#,
            r#"{"body":"x","context":9223372036854775808}"#,
            r#"{"body":"x","context":"","durability":1}"#,
            r#"{"body":"x","dedupid":"d","dedupid":"e"}"#,
            r#"{"body":"x","group":"g","expires":1209601}"#,
            r#"{"b\u006fdy":"x"}"#,
            r#"{"body":"x"} x"#,
            r#"{"id":"01a1c09f-62da-7000-a30b-0817c9a42e3f","ack":1,"ack":1}"#,
            r#"{"id":"01a1c09f-62da-7000-a30b-0817c9a42e3f","id":"x","ack":1}"#,
            r#"{ "id" : "not an id" , "ack" : 1 }"#,
            r#"{"id":"01a1c09f-62da-7000-a30b-0817c9a42e3f","ack":-1}"#,
            r#"{"id":"01a1c09f-62da-7000-a30b-0817c9a42e3f","ack":1,"context":""}"#,
        ];
        let long_context = format!(r#"{{"body":"x","context":"{}"}}"#, "c".repeat(300));
        let long_ack_context = format!(
            r#"{{"id":"01a1c09f-62da-7000-a30b-0817c9a42e3f","ack":1,"context":"{}"}}"#,
            "c".repeat(300)
        );
        for text in requests
            .iter()
            .copied()
            .chain([&*long_context, &*long_ack_context])
        {
            agrees(text).unwrap();
        }
        // The hot requests are read typed.
        assert!(read_typed(
            r#"{"body":"x","durability":1,"context":7}"#,
            QueueType::Distribute
        )
        .is_some());
        let ack = r#"{"id":"01a1c09f-62da-7000-a30b-0817c9a42e3f","ack":1,"context":"c"}"#;
        assert!(read_ack_typed(ack).is_some());
    }
}
