//! Message move tasks (StartMessageMoveTask, ListMessageMoveTasks, CancelMessageMoveTask):
//! SQS's redrive of a dead letter queue back to its source, mapped onto the node's own
//! `redrive`. A queue's dead letter queue is its own (`ARN-dlq`), so a task moves every
//! message in it back to the queue, at once, and is complete when its reply goes:
//! `MaxNumberOfMessagesPerSecond` is checked and not applied, and there is never a running
//! task to cancel. The node keeps its last [`KEPT`] tasks for ListMessageMoveTasks (a restart
//! forgets them).

use super::{Context, SqsError};
use crate::engine::Redrive;
use serde_json::{json, Value};
use std::collections::VecDeque;

/// How many finished tasks are listed (AWS lists the last ten).
pub const KEPT: usize = 10;

/// A task, finished.
#[derive(Debug, Clone)]
pub struct MoveTask {
    pub source_arn: String,
    pub destination_arn: Option<String>,
    pub moved: usize,
    pub started_ms: u64,
}

/// The node's last tasks, newest first.
#[derive(Debug, Default)]
pub struct MoveTasks {
    tasks: VecDeque<MoveTask>,
    next: u64,
}

fn text<'a>(input: &'a Value, name: &str) -> Result<Option<&'a str>, SqsError> {
    match &input[name] {
        Value::Null => Ok(None),
        Value::String(text) => Ok(Some(text)),
        _ => Err(SqsError::invalid_parameter(format!("{name} is a string."))),
    }
}

/// The task's source must be this queue's dead letter queue, and its destination (if named)
/// the queue itself.
fn check_arns(context: &Context<'_>, input: &Value) -> Result<(String, Option<String>), SqsError> {
    let source =
        text(input, "SourceArn")?.ok_or_else(|| SqsError::missing_parameter("SourceArn"))?;
    if qe_shared::sqs::queue_of_dlq_arn(source) != Some(context.queue_name) {
        return Err(SqsError::resource_not_found(
            "The SourceArn is not this queue's dead letter queue (its RedrivePolicy's deadLetterTargetArn).",
        ));
    }
    let destination = text(input, "DestinationArn")?;
    if let Some(destination) = destination {
        let queue = destination.rsplit(':').next();
        if !destination.starts_with("arn:") || queue != Some(context.queue_name) {
            return Err(SqsError::invalid_parameter(
                "A queue's dead letters move back to the queue itself: DestinationArn names it, or is left out.",
            ));
        }
    }
    Ok((source.to_string(), destination.map(str::to_string)))
}

/// StartMessageMoveTask: every message in the dead letter queue back to the queue, now.
pub async fn start(context: &Context<'_>, input: &Value) -> Result<Value, SqsError> {
    let (source_arn, destination_arn) = check_arns(context, input)?;
    match &input["MaxNumberOfMessagesPerSecond"] {
        Value::Null => {}
        value
            if value
                .as_u64()
                .or_else(|| value.as_str()?.parse().ok())
                .is_some_and(|n| (1..=500).contains(&n)) => {}
        _ => {
            return Err(SqsError::invalid_parameter(
                "MaxNumberOfMessagesPerSecond is from 1 to 500.",
            ))
        }
    }
    let started_ms = crate::engine::now_ms();
    let (moved, receipt) = context
        .node
        .queue
        .redrive(Redrive::All)
        .map_err(|refused| SqsError::unavailable(&refused.to_string()))?;
    receipt
        .wait()
        .await
        .map_err(|error| SqsError::unavailable(&error.to_string()))?;
    let mut tasks = context.move_tasks.lock().expect("never poisoned");
    let number = tasks.next;
    tasks.next += 1;
    tasks.tasks.push_front(MoveTask {
        source_arn,
        destination_arn,
        moved,
        started_ms,
    });
    tasks.tasks.truncate(KEPT);
    let handle = qe_shared::sqs::move_task_handle(context.queue_name, number);
    Ok(json!({ "TaskHandle": handle }))
}

/// ListMessageMoveTasks: the last `MaxResults` (1 to 10, default 1) tasks, newest first.
pub fn list(context: &Context<'_>, input: &Value) -> Result<Value, SqsError> {
    let (source_arn, _) = check_arns(context, input)?;
    let max = match &input["MaxResults"] {
        Value::Null => 1,
        value => match value.as_u64().or_else(|| value.as_str()?.parse().ok()) {
            Some(n) if (1..=KEPT as u64).contains(&n) => n as usize,
            _ => return Err(SqsError::invalid_parameter("MaxResults is from 1 to 10.")),
        },
    };
    let tasks = context.move_tasks.lock().expect("never poisoned");
    let results: Vec<Value> = tasks
        .tasks
        .iter()
        .filter(|task| task.source_arn == source_arn)
        .take(max)
        .map(|task| {
            let mut result = json!({
                "Status": "COMPLETED",
                "SourceArn": task.source_arn,
                "ApproximateNumberOfMessagesMoved": task.moved,
                "ApproximateNumberOfMessagesToMove": task.moved,
                "StartedTimestamp": task.started_ms,
            });
            if let Some(destination) = &task.destination_arn {
                result["DestinationArn"] = json!(destination);
            }
            result
        })
        .collect();
    Ok(json!({ "Results": results }))
}

/// CancelMessageMoveTask: a task here is complete when its reply goes, so there is none
/// running to cancel (AWS refuses to cancel one that is not running, as here).
pub fn cancel(context: &Context<'_>, input: &Value) -> Result<Value, SqsError> {
    let handle =
        text(input, "TaskHandle")?.ok_or_else(|| SqsError::missing_parameter("TaskHandle"))?;
    let ours = qe_shared::sqs::read_move_task_handle(handle)
        .is_some_and(|(queue, _)| queue == context.queue_name);
    match ours {
        true => Err(SqsError::resource_not_found(
            "The task is not running: a move here completes before its reply.",
        )),
        false => Err(SqsError::resource_not_found("No such message move task.")),
    }
}
