//! A queue's messages: `qe send`, `qe receive`, `qe tail`, `qe delete`, `qe purge`,
//! `qe messages list|get`.

use super::utc;
use crate::args::{MessagesCommand, PurgeArgs, ReceiveArgs, SendArgs, TailArgs};
use crate::context::Context;
use crate::failure::Failure;
use crate::output::{progress, Lines, Output};
use base64::Engine;
use futures::{StreamExt, TryStreamExt};
use qe_client::admin::{Content, MessageSummary, PurgeScope, StoredMessage};
use qe_client::{
    Admin, Body, CopyEvent, CopySubscriber, Durability, Event, Message, MessageId, Publisher, Role,
    Subscriber,
};
use serde_json::{json, Value};
use std::io::Read;
use std::time::Duration;

/// Connects to `queue` as its administrator, once (a CLI command does not reconnect).
pub(super) async fn admin(context: &Context, queue: &str) -> Result<Admin, Failure> {
    let endpoint = context.endpoint(queue).await?;
    let login = context.login(queue, Role::Admin)?;
    Ok(Admin::connect_with(&endpoint, login, false).await?)
}

/// A body as text: itself, or base64 for a binary one.
fn body_text(body: &Body) -> String {
    match body {
        Body::Text(text) => text.clone(),
        Body::Binary(bytes) => base64::engine::general_purpose::STANDARD.encode(bytes),
    }
}

/// `qe send`: one message, or each element of a JSON array with `--batch`, pipelined.
pub async fn send(context: &Context, args: SendArgs) -> Result<(), Failure> {
    let body = read_body(&args)?;
    let messages = match (args.batch, args.binary) {
        (true, _) => batch_of(&body)?,
        (false, true) => vec![Message::binary(body)],
        (false, false) => vec![Message::text(String::from_utf8(body).map_err(|_| {
            Failure::Usage("the body is not UTF-8 text: send it with --binary".into())
        })?)],
    };
    let messages = messages
        .into_iter()
        .map(|message| with_options(message, &args))
        .collect::<Result<Vec<_>, _>>()?;
    let endpoint = context.endpoint(&args.queue).await?;
    let login = context.login(&args.queue, Role::Publisher)?;
    let publisher = Publisher::builder(&endpoint, login)
        .reconnect(false)
        .connect()
        .await?;
    let results = publish_pipelined(&publisher, messages).await;
    let rows = results
        .iter()
        .enumerate()
        .map(|(index, result)| match result {
            Ok(id) => vec![index.to_string(), id.to_string(), String::new()],
            Err(error) => vec![index.to_string(), String::new(), error.to_string()],
        })
        .collect();
    let json: Vec<Value> = results
        .iter()
        .map(|result| match result {
            Ok(id) => json!({"id": id}),
            Err(error) => {
                json!({"error": error.to_string(), "code": error.code().map(|c| c.number())})
            }
        })
        .collect();
    let json = match args.batch {
        true => Value::from(json),
        false => json.into_iter().next().unwrap_or_default(),
    };
    Output::new(vec!["INDEX", "ID", "ERROR"], rows, json).print(context.format);
    match results.into_iter().find_map(Result::err) {
        Some(error) => Err(error.into()),
        None => Ok(()),
    }
}

/// The body's bytes: `--body`, `--body-file` (`-`: stdin), else stdin.
fn read_body(args: &SendArgs) -> Result<Vec<u8>, Failure> {
    if let Some(body) = &args.body {
        return Ok(body.clone().into_bytes());
    }
    match &args.body_file {
        Some(path) if path.as_os_str() != "-" => std::fs::read(path)
            .map_err(|e| Failure::Usage(format!("--body-file {}: {e}", path.display()))),
        _ => {
            let mut body = Vec::new();
            std::io::stdin()
                .read_to_end(&mut body)
                .map_err(|e| Failure::Usage(format!("reading the body from stdin: {e}")))?;
            Ok(body)
        }
    }
}

/// Each element of a JSON array as a message: a string as its text, anything else as its
/// JSON.
fn batch_of(body: &[u8]) -> Result<Vec<Message>, Failure> {
    let elements: Vec<Value> = serde_json::from_slice(body)
        .map_err(|e| Failure::Usage(format!("--batch takes a JSON array: {e}")))?;
    Ok(elements
        .into_iter()
        .map(|element| match element {
            Value::String(text) => Message::text(text),
            other => Message::text(other.to_string()),
        })
        .collect())
}

fn with_options(mut message: Message, args: &SendArgs) -> Result<Message, Failure> {
    if let Some(delay) = args.delay {
        message = message.delay_secs(delay);
    }
    if let Some(number) = args.durability {
        let durability = Durability::from_number(number).ok_or_else(|| {
            Failure::refused(
                qe_client::Code::InvalidDurability.number(),
                format!("--durability {number}: 0, 1 or 2"),
            )
        })?;
        message = message.durability(durability);
    }
    if let Some(key) = &args.publisher_key {
        message = message.publisher_key(key.clone());
    }
    Ok(message)
}

/// Sends every message without waiting for the replies between them (the publisher's window
/// bounds how many are in flight), then collects the replies in order.
async fn publish_pipelined(
    publisher: &Publisher,
    messages: Vec<Message>,
) -> Vec<Result<MessageId, qe_client::Error>> {
    let total = messages.len() as u64;
    let bar = match total > 1 {
        true => progress("sending", Some(total)),
        false => indicatif::ProgressBar::hidden(),
    };
    let mut pending = Vec::with_capacity(messages.len());
    for message in messages {
        pending.push(publisher.send(message).await);
    }
    let mut results = Vec::with_capacity(pending.len());
    for reply in pending {
        results.push(match reply {
            Ok(reply) => reply.await,
            Err(error) => Err(error),
        });
        bar.inc(1);
    }
    bar.finish_and_clear();
    results
}

const DELIVERY_COLUMNS: [&str; 4] = ["ID", "RECEIVED", "KEY", "BODY"];

/// A delivery's line and JSON.
fn delivery_item(
    id: Option<&MessageId>,
    body: &Body,
    key: Option<&str>,
    received_at: u64,
) -> (Vec<String>, Value) {
    let text = body_text(body);
    let row = vec![
        id.map_or("-".to_string(), MessageId::to_string),
        utc(received_at),
        key.unwrap_or("").to_string(),
        text.clone(),
    ];
    let json = json!({"id": id, "body": text, "binary": body.is_binary(),
                      "publisher_key": key, "received_at": received_at});
    (row, json)
}

fn delivery_line(delivery: &qe_client::Delivery) -> (Vec<String>, Value) {
    delivery_item(
        Some(delivery.id()),
        delivery.body(),
        delivery.publisher_key(),
        delivery.received_at(),
    )
}

/// `qe receive`: up to `--max-messages` within `--wait-seconds`, printed as they come;
/// acknowledged with `--delete`, else given back by the logout (the manual's Sessions: to
/// the first subscriber with room, else to the back of the queue).
pub async fn receive(context: &Context, args: ReceiveArgs) -> Result<(), Failure> {
    if !args.wait_seconds.is_finite() || args.wait_seconds < 0.0 {
        return Err(Failure::Usage(
            "--wait-seconds takes a number of seconds, 0 or more".into(),
        ));
    }
    let endpoint = context.endpoint(&args.queue).await?;
    let login = context.login(&args.queue, Role::Subscriber)?;
    let mut subscriber = Subscriber::builder(&endpoint, login)
        .capacity(args.max_messages)
        .connect()
        .await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(args.wait_seconds);
    let received = receive_until(&mut subscriber, &args, deadline, context.format).await;
    // Logged out whatever ended it, so what the session holds goes back to the queue now.
    let logged_out = subscriber.logout().await;
    received?;
    Ok(logged_out?)
}

/// Shows up to `--max-messages` until `deadline`, acknowledging each after it with --delete.
async fn receive_until(
    subscriber: &mut Subscriber,
    args: &ReceiveArgs,
    deadline: tokio::time::Instant,
    format: crate::output::Format,
) -> Result<(), Failure> {
    let mut lines = Lines::new(format, DELIVERY_COLUMNS.to_vec());
    let mut received = 0;
    while received < args.max_messages {
        let event = match tokio::time::timeout_at(deadline, subscriber.next()).await {
            Err(_) | Ok(None) => break,
            Ok(Some(event)) => event?,
        };
        let Event::Message(delivery) = event else {
            continue;
        };
        // Shown first, then acknowledged: a stop between the two shows it again later (at
        // least once), never loses it.
        let (row, json) = delivery_line(&delivery);
        if lines.item(&row, &json).is_err() {
            // Not shown (stdout closed): not acknowledged, so it stays in the queue.
            break;
        }
        received += 1;
        if args.delete {
            acknowledge(delivery).await?;
        }
    }
    Ok(())
}

/// Acknowledges a delivery already shown. One whose session ended meanwhile (the node
/// restarted and could not resume it) cannot be acknowledged: the queue delivers it again,
/// and it is shown again (at least once), which is not a failure.
async fn acknowledge(delivery: qe_client::Delivery) -> Result<(), Failure> {
    match delivery.ack().await {
        Ok(()) | Err(qe_client::Error::SessionEnded) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// `qe tail`: every message as it arrives, until Ctrl-C, `--count` of them, or stdout closes.
pub async fn tail(context: &Context, args: TailArgs) -> Result<(), Failure> {
    let endpoint = context.endpoint(&args.queue).await?;
    let login = context.login(&args.queue, Role::Subscriber)?;
    let lines = Lines::new(context.format, DELIVERY_COLUMNS.to_vec());
    let count = args.count.unwrap_or(u64::MAX);
    match args.copy {
        true => {
            tail_copy(
                CopySubscriber::connect(&endpoint, login).await?,
                lines,
                count,
            )
            .await
        }
        false => {
            let subscriber = Subscriber::connect(&endpoint, login, args.capacity).await?;
            tail_distribute(subscriber, lines, count).await
        }
    }
}

async fn tail_distribute(
    mut subscriber: Subscriber,
    mut lines: Lines,
    count: u64,
) -> Result<(), Failure> {
    let drained = drain(&mut subscriber, &mut lines, count).await;
    // Logged out whatever ended it (a failure too), so what the session holds goes back to
    // the queue now rather than when its saved session expires; this waits for the acks'
    // replies, so none of the messages shown comes again.
    let logged_out = subscriber.logout().await;
    drained?;
    Ok(logged_out?)
}

/// Shows and acknowledges messages until Ctrl-C, `count` of them, or stdout closes.
async fn drain(subscriber: &mut Subscriber, lines: &mut Lines, count: u64) -> Result<(), Failure> {
    let mut stop = std::pin::pin!(tokio::signal::ctrl_c());
    let mut printed = 0;
    while printed < count {
        let event = tokio::select! {
            _ = &mut stop => break,
            event = subscriber.next() => event,
        };
        let Some(event) = event else { break };
        let Event::Message(delivery) = event? else {
            continue;
        };
        let (row, json) = delivery_line(&delivery);
        if lines.item(&row, &json).is_err() {
            // Not shown (stdout closed): not acknowledged, so it stays in the queue.
            break;
        }
        printed += 1;
        acknowledge(delivery).await?;
    }
    Ok(())
}

async fn tail_copy(
    mut subscriber: CopySubscriber,
    mut lines: Lines,
    count: u64,
) -> Result<(), Failure> {
    let mut stop = std::pin::pin!(tokio::signal::ctrl_c());
    let mut printed = 0;
    while printed < count {
        let event = tokio::select! {
            _ = &mut stop => break,
            event = subscriber.next() => event,
        };
        let Some(event) = event else { break };
        let CopyEvent::Message(message) = event? else {
            continue;
        };
        let (row, json) = delivery_item(None, &message.body, None, message.received_at);
        printed += 1;
        if lines.item(&row, &json).is_err() {
            break;
        }
    }
    Ok(())
}

/// `qe delete`: one message that is waiting, held or delayed.
pub async fn delete(context: &Context, queue: &str, id: &str) -> Result<(), Failure> {
    let id = MessageId::from(id);
    admin(context, queue).await?.delete_message(&id).await?;
    Output::new(
        vec!["DELETED"],
        vec![vec![id.to_string()]],
        json!({"deleted": id}),
    )
    .print(context.format);
    Ok(())
}

/// `qe purge`: the waiting messages, or the scope the flags name.
pub async fn purge(context: &Context, args: PurgeArgs) -> Result<(), Failure> {
    let scope = match (args.dlq, args.delayed, args.all) {
        (true, _, _) => PurgeScope::DeadLetter,
        (_, true, _) => PurgeScope::Delayed,
        (_, _, true) => PurgeScope::All,
        _ => PurgeScope::Waiting,
    };
    purge_scope(context, &args.queue, scope).await
}

/// Purges `scope` of `queue` and prints how many went.
pub(super) async fn purge_scope(
    context: &Context,
    queue: &str,
    scope: PurgeScope,
) -> Result<(), Failure> {
    let admin = admin(context, queue).await?;
    let bar = progress(&format!("purging {}", scope.name()), None);
    let purged = admin.purge(scope).await;
    bar.finish_and_clear();
    let purged = purged?;
    Output::new(
        vec!["QUEUE", "SCOPE", "PURGED"],
        vec![vec![
            queue.to_string(),
            scope.name().to_string(),
            purged.to_string(),
        ]],
        json!({"queue": queue, "scope": scope.name(), "purged": purged}),
    )
    .print(context.format);
    Ok(())
}

/// `qe messages list|get`.
pub async fn messages(context: &Context, command: MessagesCommand) -> Result<(), Failure> {
    match command {
        MessagesCommand::List { queue } => {
            let admin = admin(context, &queue).await?;
            let list = every_page(admin.all_messages(), "listing messages").await?;
            summaries(&list, false).print(context.format);
        }
        MessagesCommand::Get { queue, id } => {
            let admin = admin(context, &queue).await?;
            let stored = admin.message(&MessageId::from(id)).await?;
            stored_output(&stored).print(context.format);
        }
    }
    Ok(())
}

/// Reads every page of a listing, counting on stderr as it goes.
pub(super) async fn every_page(
    pages: impl futures::Stream<Item = qe_client::Result<MessageSummary>>,
    what: &str,
) -> Result<Vec<MessageSummary>, Failure> {
    let bar = progress(what, None);
    let mut pages = std::pin::pin!(pages);
    let mut list = Vec::new();
    while let Some(summary) = pages.try_next().await? {
        list.push(summary);
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(list)
}

/// A listing of messages (getmsgs, or with `dlq` getdlqmsgs, which adds when and why each
/// was dead-lettered) as a table and JSON.
pub(super) fn summaries(list: &[MessageSummary], dlq: bool) -> Output {
    let kind = |binary: bool| if binary { "binary" } else { "text" };
    let rows = list
        .iter()
        .map(|m| {
            let mut row = vec![
                m.id.to_string(),
                m.len.to_string(),
                m.delay_secs.to_string(),
                m.durability.number().to_string(),
                kind(m.binary).to_string(),
                utc(m.received_at),
            ];
            if dlq {
                row.push(m.dead_lettered_at.map_or("-".to_string(), utc));
                row.push(m.dead_reason.clone().unwrap_or_else(|| "-".to_string()));
            }
            row
        })
        .collect();
    let json: Vec<Value> = list
        .iter()
        .map(|m| {
            let mut line = json!({"id": m.id, "len": m.len, "delay_secs": m.delay_secs,
                   "durability": m.durability.number(), "binary": m.binary,
                   "received_at": m.received_at});
            if dlq {
                line["dead_lettered_at"] = m.dead_lettered_at.into();
                line["dlq_reason"] = m.dead_reason.clone().into();
            }
            line
        })
        .collect();
    let mut headers = vec!["ID", "LEN", "DELAY", "DURABILITY", "TYPE", "RECEIVED"];
    if dlq {
        headers.extend(["DEAD-LETTERED", "REASON"]);
    }
    Output::new(headers, rows, json.into())
}

/// One stored message (getmsg, getdlqmsg) as FIELD, VALUE rows and JSON.
pub(super) fn stored_output(stored: &StoredMessage) -> Output {
    let mut rows = vec![
        vec!["ID".to_string(), stored.id.to_string()],
        vec!["LEN".to_string(), stored.len.to_string()],
        vec!["DELAY".to_string(), stored.delay_secs.to_string()],
        vec![
            "DURABILITY".to_string(),
            stored.durability.number().to_string(),
        ],
    ];
    let mut json = json!({"id": stored.id, "len": stored.len, "delay_secs": stored.delay_secs,
                          "durability": stored.durability.number()});
    if let Some(reason) = &stored.dead_reason {
        rows.push(vec!["DLQ REASON".to_string(), reason.clone()]);
        json["dlq_reason"] = reason.clone().into();
        let at = stored.dead_lettered_at;
        rows.push(vec![
            "DEAD-LETTERED".to_string(),
            at.map_or("-".into(), utc),
        ]);
        json["dead_lettered_at"] = at.into();
    }
    match &stored.content {
        Content::Message {
            body,
            publisher_key,
            received_at,
        } => {
            rows.push(vec!["RECEIVED".into(), utc(*received_at)]);
            rows.push(vec![
                "KEY".into(),
                publisher_key.clone().unwrap_or_default(),
            ]);
            rows.push(vec!["BINARY".into(), body.is_binary().to_string()]);
            rows.push(vec!["BODY".into(), body_text(body)]);
            json["received_at"] = (*received_at).into();
            json["publisher_key"] = json!(publisher_key);
            json["binary"] = body.is_binary().into();
            json["body"] = body_text(body).into();
        }
        Content::Damaged { file } => {
            let file = file
                .as_ref()
                .map(|file| base64::engine::general_purpose::STANDARD.encode(file));
            rows.push(vec!["DAMAGED".into(), "true".into()]);
            rows.push(vec![
                "FILE (BASE64)".into(),
                file.clone().unwrap_or_default(),
            ]);
            json["damaged"] = true.into();
            json["file"] = json!(file);
        }
    }
    Output::new(vec!["FIELD", "VALUE"], rows, json)
}
