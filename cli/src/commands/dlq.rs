//! `qe dlq list|get|delete|redrive|purge`: the dead letter queue.

use super::data::{admin, every_page, purge_scope, stored_output, summaries};
use crate::args::DlqCommand;
use crate::context::Context;
use crate::failure::Failure;
use crate::output::{progress, Output};
use futures::StreamExt;
use qe_client::admin::{PurgeScope, Redrive};
use qe_client::MessageId;
use serde_json::json;

/// How many `deldlqmsg` are in flight at once.
const DELETES_IN_FLIGHT: usize = 64;

/// Runs one `qe dlq` command.
pub async fn run(context: &Context, command: DlqCommand) -> Result<(), Failure> {
    match command {
        DlqCommand::List { queue } => {
            let admin = admin(context, &queue).await?;
            let list = every_page(admin.all_dlq_messages(), "listing the DLQ").await?;
            summaries(&list, true).print(context.format);
            Ok(())
        }
        DlqCommand::Get { queue, id } => {
            let admin = admin(context, &queue).await?;
            let stored = admin.dlq_message(&MessageId::from(id)).await?;
            stored_output(&stored).print(context.format);
            Ok(())
        }
        DlqCommand::Delete { queue, ids } => delete(context, &queue, ids).await,
        DlqCommand::Redrive { queue, ids, count } => {
            let which = match (ids.is_empty(), count) {
                (_, Some(count)) => Redrive::Oldest(count),
                (true, None) => Redrive::All,
                (false, None) => Redrive::Ids(ids.into_iter().map(MessageId::from).collect()),
            };
            redrive(context, &queue, which).await
        }
        DlqCommand::Purge { queue } => purge_scope(context, &queue, PurgeScope::DeadLetter).await,
    }
}

/// Deletes each message, many in flight; prints what became of each, and fails with the
/// first failure.
async fn delete(context: &Context, queue: &str, ids: Vec<String>) -> Result<(), Failure> {
    let admin = admin(context, queue).await?;
    let bar = progress("deleting", Some(ids.len() as u64));
    let results: Vec<(String, qe_client::Result<()>)> = futures::stream::iter(ids)
        .map(|id| {
            let (admin, bar) = (admin.clone(), bar.clone());
            async move {
                let result = admin
                    .delete_dlq_message(&MessageId::from(id.as_str()))
                    .await;
                bar.inc(1);
                (id, result)
            }
        })
        .buffered(DELETES_IN_FLIGHT)
        .collect()
        .await;
    bar.finish_and_clear();
    let outcome = |result: &qe_client::Result<()>| match result {
        Ok(()) => "deleted".to_string(),
        Err(error) => error.to_string(),
    };
    let rows = results
        .iter()
        .map(|(id, result)| vec![id.clone(), outcome(result)])
        .collect();
    let json: Vec<_> = results
        .iter()
        .map(|(id, result)| {
            json!({"id": id, "deleted": result.is_ok(),
                                   "error": result.as_ref().err().map(ToString::to_string)})
        })
        .collect();
    Output::new(vec!["ID", "RESULT"], rows, json.into()).print(context.format);
    match results.into_iter().find_map(|(_, result)| result.err()) {
        Some(error) => Err(error.into()),
        None => Ok(()),
    }
}

/// Moves dead letters back to the queue in one command; prints how many moved.
async fn redrive(context: &Context, queue: &str, which: Redrive) -> Result<(), Failure> {
    let admin = admin(context, queue).await?;
    let bar = progress("redriving", None);
    let redriven = admin.redrive(which).await;
    bar.finish_and_clear();
    let redriven = redriven?;
    Output::new(
        vec!["QUEUE", "REDRIVEN"],
        vec![vec![queue.to_string(), redriven.to_string()]],
        json!({"queue": queue, "redriven": redriven}),
    )
    .print(context.format);
    Ok(())
}
