//! The query protocol: what SDKs released before AWS moved SQS to its JSON protocol (late
//! 2023) speak. A request is a form (`Action=SendMessage&QueueUrl=...&MessageBody=...`),
//! lists and maps flattened into numbered parameters (`AttributeName.1`,
//! `MessageAttribute.1.Name`, `MessageAttribute.1.Value.StringValue`); the reply is XML.
//!
//! Nothing here runs an action. [`input`] turns the form into the JSON protocol's input, which
//! `actions` reads; [`reply`] and [`error`] turn its answer into the XML those SDKs parse.
//! Both follow SQS's model (2012-11-05): the flattened member names below are its own.

use super::SqsError;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::fmt::Write;

/// AWS's namespace for SQS's XML.
const XMLNS: &str = "http://queue.amazonaws.com/doc/2012-11-05/";

/// A flattened list's member name, and the JSON protocol's name for the list.
const LISTS: [(&str, &str); 7] = [
    ("AttributeName", "AttributeNames"),
    ("MessageAttributeName", "MessageAttributeNames"),
    ("MessageSystemAttributeName", "MessageSystemAttributeNames"),
    ("SendMessageBatchRequestEntry", "Entries"),
    ("DeleteMessageBatchRequestEntry", "Entries"),
    ("ChangeMessageVisibilityBatchRequestEntry", "Entries"),
    ("TagKey", "TagKeys"),
];

/// A flattened map's entry name, the JSON name for it, and its entries' key's name (each
/// entry has that and `.Value`).
const MAPS: [(&str, &str, &str); 4] = [
    ("Attribute", "Attributes", "Name"),
    ("MessageAttribute", "MessageAttributes", "Name"),
    ("MessageSystemAttribute", "MessageSystemAttributes", "Name"),
    ("Tag", "Tags", "Key"),
];

/// The most parameters a form has: a batch of ten messages with ten attributes each needs
/// about 400.
const MOST_PARAMETERS: usize = 1000;

/// The most parts a parameter's name has: SQS's deepest is six
/// (`SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.StringValue`).
const MOST_PARTS: usize = 8;

/// The actions whose reply carries nothing but its request id.
const NO_OUTPUT: [&str; 7] = [
    "DeleteMessage",
    "ChangeMessageVisibility",
    "SetQueueAttributes",
    "PurgeQueue",
    "DeleteQueue",
    "TagQueue",
    "UntagQueue",
];

/// Whether a request speaks the query protocol: a form (its `Content-Type`), without the
/// JSON protocol's target (`X-Amz-Target`).
pub fn is_query(content_type: Option<&str>, has_target: bool) -> bool {
    let form = content_type.is_some_and(|t| t.starts_with("application/x-www-form-urlencoded"));
    form && !has_target
}

/// The action a form names, and its parameters in the JSON protocol's shape.
pub fn input(form: &[u8]) -> Result<(String, Value), SqsError> {
    let mut action = None;
    let mut tree = Tree::default();
    let pairs = form.split(|b| *b == b'&').filter(|pair| !pair.is_empty());
    for (n, pair) in pairs.enumerate() {
        // (Counted before anything is kept: a form of many tiny parameters would otherwise
        // cost far more memory than its own size.)
        if n == MOST_PARAMETERS {
            return Err(SqsError::invalid_parameter(format!(
                "A request has at most {MOST_PARAMETERS} parameters."
            )));
        }
        let (name, value) = match pair.iter().position(|b| *b == b'=') {
            Some(at) => (decoded(&pair[..at])?, decoded(&pair[at + 1..])?),
            None => (decoded(pair)?, String::new()),
        };
        match name.as_str() {
            "Action" if action.is_some() => return Err(malformed(&name)),
            "Action" => action = Some(value),
            "Version" => {}
            _ => tree.insert(&name, value)?,
        }
    }
    let action = action.ok_or_else(|| SqsError::missing_parameter("Action"))?;
    Ok((action, Value::Object(tree.into_json()?)))
}

/// A form's name or value: `+` is a space, `%XX` a byte, and the bytes must be UTF-8 (SQS
/// refuses what is not, rather than replace it).
fn decoded(encoded: &[u8]) -> Result<String, SqsError> {
    let spaced: Vec<u8> = encoded
        .iter()
        .map(|b| if *b == b'+' { b' ' } else { *b })
        .collect();
    let bytes: Vec<u8> = percent_encoding::percent_decode(&spaced).collect();
    String::from_utf8(bytes).map_err(|_| {
        SqsError::invalid_parameter("A parameter's name or value is not UTF-8.".to_string())
    })
}

/// A name that cannot be read as SQS's.
fn malformed(name: &str) -> SqsError {
    let name = super::shown(name);
    SqsError::invalid_parameter(format!("The parameter {name} is malformed."))
}

/// The parameters as a tree: `A.1.B=x` is A → 1 → B → x.
#[derive(Default)]
struct Tree(BTreeMap<String, Node>);

enum Node {
    Leaf(String),
    Branch(Tree),
}

impl Tree {
    fn insert(&mut self, name: &str, value: String) -> Result<(), SqsError> {
        let malformed = || malformed(name);
        // (The tree is walked by recursion: its depth is bounded before it is built.)
        if name.split('.').count() > MOST_PARTS {
            return Err(malformed());
        }
        let mut tree = self;
        let mut parts = name.split('.').peekable();
        while let Some(part) = parts.next() {
            if part.is_empty() {
                return Err(malformed());
            }
            if parts.peek().is_none() {
                return match tree.0.insert(part.to_string(), Node::Leaf(value)) {
                    None => Ok(()),
                    Some(_) => Err(malformed()),
                };
            }
            let node = tree
                .0
                .entry(part.to_string())
                .or_insert_with(|| Node::Branch(Tree::default()));
            tree = match node {
                Node::Branch(inner) => inner,
                Node::Leaf(_) => return Err(malformed()),
            };
        }
        Err(malformed())
    }

    /// The JSON protocol's object for this tree: flattened lists and maps by SQS's names,
    /// every value a string (the actions read numbers from strings too).
    fn into_json(self) -> Result<Map<String, Value>, SqsError> {
        let mut object = Map::new();
        for (name, node) in self.0 {
            let list = LISTS.iter().find(|(member, _)| *member == name);
            let map = MAPS.iter().find(|(entry, _, _)| *entry == name);
            let (key, value) = match (node, list, map) {
                (Node::Leaf(text), None, None) => (name, Value::String(text)),
                (Node::Branch(items), Some((_, json)), _) => {
                    (json.to_string(), Value::Array(items.numbered(&name)?))
                }
                (Node::Branch(entries), _, Some((_, json, key))) => (
                    json.to_string(),
                    Value::Object(entries.entries(&name, key)?),
                ),
                (Node::Branch(inner), None, None) => (name, Value::Object(inner.into_json()?)),
                (Node::Leaf(_), _, _) => return Err(malformed(&name)),
            };
            // Two names for one key (`AttributeName.1` and `AttributeNames`, or two kinds
            // of batch entry) are refused, not one dropped.
            if object.contains_key(&key) {
                return Err(malformed(&key));
            }
            object.insert(key, value);
        }
        Ok(object)
    }

    /// A flattened list's items (`NAME.1`, `NAME.2`, ...) in their order.
    fn numbered(self, name: &str) -> Result<Vec<Value>, SqsError> {
        let mut items = Vec::with_capacity(self.0.len());
        for (index, node) in self.0 {
            let index: u32 = index
                .parse()
                .map_err(|_| malformed(&format!("{name}.{index}")))?;
            let value = match node {
                Node::Leaf(text) => Value::String(text),
                Node::Branch(inner) => Value::Object(inner.into_json()?),
            };
            items.push((index, value));
        }
        items.sort_by_key(|(index, _)| *index);
        Ok(items.into_iter().map(|(_, value)| value).collect())
    }

    /// A flattened map's entries (`NAME.N.KEY`, `NAME.N.Value`) as one object.
    fn entries(self, name: &str, key_name: &str) -> Result<Map<String, Value>, SqsError> {
        let mut object = Map::new();
        for entry in self.numbered(name)? {
            let key = entry[key_name].as_str().map(str::to_string);
            let missing = || SqsError::missing_parameter(&format!("{name}.N.{key_name}"));
            let key = key.ok_or_else(missing)?;
            let value = entry.get("Value").cloned();
            let value =
                value.ok_or_else(|| SqsError::missing_parameter(&format!("{name}.N.Value")))?;
            object.insert(key, value);
        }
        Ok(object)
    }
}

/// `answer` (the JSON protocol's reply to `action`) as the query protocol's XML.
pub fn reply(action: &str, answer: &Value, request_id: &str) -> String {
    let mut result = String::new();
    if let Value::Object(fields) = answer {
        for (name, value) in fields {
            element(action, name, value, &mut result);
        }
    }
    // An action with an output has its result element even when it is empty (a receive
    // that found nothing): the SDKs look for it.
    let result = match NO_OUTPUT.contains(&action) {
        true => String::new(),
        false => format!("<{action}Result>{result}</{action}Result>"),
    };
    format!(
        "<?xml version=\"1.0\"?><{action}Response xmlns=\"{XMLNS}\">{result}\
         <ResponseMetadata><RequestId>{request_id}</RequestId></ResponseMetadata></{action}Response>"
    )
}

/// One field of a reply: lists flattened under their member's name, maps as `Name`/`Value`
/// entries, as SQS's model names them.
fn element(action: &str, name: &str, value: &Value, out: &mut String) {
    match (name, value) {
        ("Messages", Value::Array(items)) => each("Message", items, action, out),
        // (ListDeadLetterSourceQueues' list is `queueUrls` in the JSON protocol.)
        ("QueueUrls" | "queueUrls", Value::Array(items)) => each("QueueUrl", items, action, out),
        ("Successful", Value::Array(items)) => {
            each(&format!("{action}ResultEntry"), items, action, out)
        }
        ("Failed", Value::Array(items)) => each("BatchResultErrorEntry", items, action, out),
        ("Tags", Value::Object(entries)) => {
            for (key, value) in entries {
                out.push_str("<Tag><Key>");
                push_escaped(out, key);
                out.push_str("</Key>");
                element(action, "Value", value, out);
                out.push_str("</Tag>");
            }
        }
        ("Attributes" | "MessageAttributes", Value::Object(entries)) => {
            let entry = name.trim_end_matches('s');
            for (key, value) in entries {
                let _ = write!(out, "<{entry}><Name>");
                push_escaped(out, key);
                out.push_str("</Name>");
                element(action, "Value", value, out);
                let _ = write!(out, "</{entry}>");
            }
        }
        (_, Value::Object(fields)) => {
            let _ = write!(out, "<{name}>");
            for (inner, value) in fields {
                element(action, inner, value, out);
            }
            let _ = write!(out, "</{name}>");
        }
        (_, Value::Array(items)) => each(name, items, action, out),
        (_, Value::Null) => {}
        (_, Value::String(text)) => {
            let _ = write!(out, "<{name}>");
            push_escaped(out, text);
            let _ = write!(out, "</{name}>");
        }
        (_, scalar) => {
            let _ = write!(out, "<{name}>{scalar}</{name}>");
        }
    }
}

fn each(member: &str, items: &[Value], action: &str, out: &mut String) {
    for item in items {
        element(action, member, item, out);
    }
}

/// `error` as the query protocol's XML error.
pub fn error(error: &SqsError, request_id: &str) -> String {
    let kind = match error.is_server_error() {
        true => "Receiver",
        false => "Sender",
    };
    let mut out = format!(
        "<?xml version=\"1.0\"?><ErrorResponse xmlns=\"{XMLNS}\"><Error><Type>{kind}</Type><Code>"
    );
    push_escaped(&mut out, error.code);
    out.push_str("</Code><Message>");
    push_escaped(&mut out, &error.message);
    let _ = write!(
        out,
        "</Message><Detail/></Error><RequestId>{request_id}</RequestId></ErrorResponse>"
    );
    out
}

/// Appends text as XML character data. A carriage return is written as a reference: a parser turns
/// a bare one into a newline, and bodies must come back as they were sent. A character XML
/// cannot carry at all (a control character in a message published over WebSocket, where
/// the manual allows any) is written as U+FFFD: the reply stays readable, and its MD5OfBody,
/// of the message as it is, tells an SDK that checks it that the body is not.
fn push_escaped(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            c if !super::allowed_in_text(c) => out.push('\u{fffd}'),
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\r' => out.push_str("&#xD;"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_form_becomes_the_json_protocols_input() {
        let form = "Action=SendMessageBatch&Version=2012-11-05&QueueUrl=http%3A%2F%2Fh%2Fqueue\
            &SendMessageBatchRequestEntry.2.Id=b&SendMessageBatchRequestEntry.2.MessageBody=two\
            &SendMessageBatchRequestEntry.1.Id=a&SendMessageBatchRequestEntry.1.MessageBody=one+%26\
            &SendMessageBatchRequestEntry.1.DelaySeconds=5\
            &SendMessageBatchRequestEntry.1.MessageAttribute.1.Name=k\
            &SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.DataType=String\
            &SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.StringValue=v";
        let (action, input) = super::input(form.as_bytes()).unwrap();
        assert_eq!(action, "SendMessageBatch");
        assert_eq!(
            input,
            json!({
                "QueueUrl": "http://h/queue",
                "Entries": [
                    {"Id": "a", "MessageBody": "one &", "DelaySeconds": "5",
                     "MessageAttributes": {"k": {"DataType": "String", "StringValue": "v"}}},
                    {"Id": "b", "MessageBody": "two"},
                ],
            })
        );
        let form = "Action=ReceiveMessage&AttributeName.1=All&AttributeName.10=B&AttributeName.2=A";
        let (_, input) = super::input(form.as_bytes()).unwrap();
        assert_eq!(input["AttributeNames"], json!(["All", "A", "B"]));
        let form =
            "Action=SetQueueAttributes&Attribute.1.Name=VisibilityTimeout&Attribute.1.Value=40";
        let (_, input) = super::input(form.as_bytes()).unwrap();
        assert_eq!(input["Attributes"], json!({"VisibilityTimeout": "40"}));
    }

    #[test]
    fn a_form_has_at_most_a_thousand_parameters() {
        let form = |count: usize| {
            let named = (1..count).map(|n| format!("&x{n}=1")).collect::<String>();
            format!("Action=SendMessage{named}")
        };
        assert!(super::input(form(1000).as_bytes()).is_ok());
        let refused = super::input(form(1001).as_bytes()).unwrap_err();
        assert!(
            refused.message.contains("at most 1000"),
            "{}",
            refused.message
        );
    }

    #[test]
    fn a_malformed_form_is_refused_with_the_parameters_name() {
        for form in [
            "QueueUrl=x",
            "Action=SendMessage&A=1&A.1=2",
            "Action=SendMessage&A.1=2&A=1",
            "Action=ReceiveMessage&AttributeName=All",
            "Action=ReceiveMessage&AttributeName.x=All",
            "Action=SendMessage&MessageAttribute.1.Value.StringValue=v",
            "Action=SendMessage&a..b=1",
            &format!("Action=SendMessage&{}=1", vec!["a"; 100_000].join(".")),
            &(0..1000).fold("Action=SendMessage".to_string(), |form, n| {
                form + &format!("&x{n}=1")
            }),
            "Action=SendMessage&Action=GetQueueUrl",
            "Action=SendMessage&MessageBody=%FF%FE",
            "Action=ReceiveMessage&AttributeName.1=All&AttributeNames=All",
            "Action=DeleteMessageBatch&DeleteMessageBatchRequestEntry.1.Id=a\
             &SendMessageBatchRequestEntry.1.Id=b",
        ] {
            let refused = super::input(form.as_bytes()).unwrap_err();
            assert_eq!(refused.status, 400, "{form}");
        }
    }

    #[test]
    fn a_reply_is_the_query_protocols_xml() {
        let answer = json!({
            "Messages": [{
                "MessageId": "m1", "Body": "a <b> & \"c\"\r\n",
                "Attributes": {"ApproximateReceiveCount": "1"},
                "MessageAttributes": {"k": {"DataType": "String", "StringValue": "v"}},
            }],
        });
        let xml = reply("ReceiveMessage", &answer, "r1");
        let start = "<?xml version=\"1.0\"?><ReceiveMessageResponse xmlns=\"http://queue.amazonaws.com/doc/2012-11-05/\"><ReceiveMessageResult>";
        assert!(xml.starts_with(start), "{xml}");
        assert!(xml.contains("<Message><Attribute><Name>ApproximateReceiveCount</Name><Value>1</Value></Attribute>\
            <Body>a &lt;b&gt; &amp; &quot;c&quot;&#xD;\n</Body>\
            <MessageAttribute><Name>k</Name><Value><DataType>String</DataType><StringValue>v</StringValue></Value></MessageAttribute>\
            <MessageId>m1</MessageId></Message></ReceiveMessageResult>"), "{xml}");
        let batch =
            json!({"Successful": [{"Id": "a"}], "Failed": [{"Id": "b", "SenderFault": true}]});
        let xml = reply("DeleteMessageBatch", &batch, "r1");
        assert!(xml.contains("<BatchResultErrorEntry><Id>b</Id><SenderFault>true</SenderFault></BatchResultErrorEntry>\
            <DeleteMessageBatchResultEntry><Id>a</Id></DeleteMessageBatchResultEntry>"), "{xml}");
        let xml = reply(
            "ReceiveMessage",
            &json!({"Messages": [{"Body": "a\u{1}b\u{0}"}]}),
            "r1",
        );
        assert!(xml.contains("<Body>a\u{fffd}b\u{fffd}</Body>"), "{xml}");
        let xml = reply("ReceiveMessage", &json!({}), "r1");
        assert!(
            xml.contains("<ReceiveMessageResult></ReceiveMessageResult>"),
            "{xml}"
        );
        let xml = reply("PurgeQueue", &json!({}), "r1");
        assert!(xml.contains("<RequestId>r1</RequestId>"), "{xml}");
        assert!(xml.contains("<PurgeQueueResponse xmlns=\"http://queue.amazonaws.com/doc/2012-11-05/\"><ResponseMetadata>"), "{xml}");
        let xml = error(&SqsError::queue_does_not_exist(), "r1");
        assert!(
            xml.contains(
                "<Error><Type>Sender</Type><Code>AWS.SimpleQueueService.NonExistentQueue</Code>"
            ),
            "{xml}"
        );
    }
}
