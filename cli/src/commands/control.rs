//! The control plane's API: `qe queues list|get|create|delete`, `qe logins rotate`,
//! `qe usage`, `qe stats`, `qe bills`.

use super::{json_of, utc};
use crate::args::{BillArgs, LoginsCommand, QueuesCommand, RangeArgs, TierArg};
use crate::config::QueueLogins;
use crate::context::Context;
use crate::failure::Failure;
use crate::output::Output;
use qe_client::control_plane::{
    ControlPlane, CreatedQueue, NewQueue, Queue, QueueStatus, RecordQuery, StandbyLag, Tier,
};
use serde_json::json;
use std::time::Duration;

/// How long `qe queues create` waits for the queue's node (the API holds a request at most
/// this long).
const CREATE_WITHIN: Duration = Duration::from_secs(120);

/// `qe queues ...` (but `login`, which only writes the config file).
pub async fn queues(context: &mut Context, command: QueuesCommand) -> Result<(), Failure> {
    match command {
        QueuesCommand::List { live } => list(context, live).await,
        QueuesCommand::Get { queue } => get(context, &queue).await,
        QueuesCommand::Create {
            tier,
            region,
            instance_type,
            ipv4,
            account,
            name,
            tags,
            replicas,
            no_wait,
        } => {
            let tier = match tier {
                TierArg::Devtest => Tier::Devtest,
                TierArg::Standard => Tier::Standard,
            };
            let mut new = NewQueue::new(tier, region, instance_type).ipv4(ipv4);
            if replicas != 1 {
                new = new.replicas(replicas);
            }
            if let Some(account) = account {
                new = new.account(account);
            }
            if let Some(name) = name {
                new = new.name(name);
            }
            for (key, value) in tags {
                new = new.tag(key, value);
            }
            create(context, &new, !no_wait).await
        }
        QueuesCommand::Delete { queue } => delete(context, &queue).await,
        QueuesCommand::Login { .. } => unreachable!("dispatched to login::queue_login"),
    }
}

/// A serde enum's wire name (`running`, `devtest`).
fn name_of<T: serde::Serialize>(value: &T) -> String {
    json_of(value).as_str().unwrap_or_default().to_string()
}

const QUEUE_COLUMNS: [&str; 6] = ["ID", "STATUS", "TIER", "REGION", "INSTANCE TYPE", "URL"];
/// The `--live` columns: waiting (the depth), held (in flight), delayed, dead-lettered, how
/// old the node's report is, and its standby (`-` for a queue without one).
const LIVE_COLUMNS: [&str; 6] = ["DEPTH", "IN FLIGHT", "DELAYED", "DLQ", "AGE", "STANDBY"];

fn queue_row(queue: &Queue, live: bool) -> Vec<String> {
    let mut row = vec![
        queue.id.clone(),
        name_of(&queue.status),
        name_of(&queue.tier),
        queue.region.clone(),
        queue.instance_type.clone(),
        queue.url.clone(),
    ];
    if live {
        row.extend(live_cells(queue));
    }
    row
}

/// The live numbers as cells; `-` for each when the node has not reported lately (which is
/// not zero).
fn live_cells(queue: &Queue) -> Vec<String> {
    match &queue.live {
        Some(live) => vec![
            live.waiting.to_string(),
            live.held.to_string(),
            live.delayed.to_string(),
            live.dead_letter.to_string(),
            format!("{:.0}s", live.age_secs),
            standby_cell(live.standby),
        ],
        None => vec!["-".to_string(); LIVE_COLUMNS.len()],
    }
}

/// A standby as `in sync (N B behind)`, `catching up (N B behind)`, or `absent for N s (N B
/// behind)` while none has stayed attached to the node (none is, or the one attached has not
/// settled yet: `StandbyLag::absent_ms`).
fn standby_cell(standby: Option<StandbyLag>) -> String {
    let Some(standby) = standby else {
        return "-".to_string();
    };
    let state = match standby {
        StandbyLag { in_sync: true, .. } => "in sync".to_string(),
        StandbyLag { absent_ms: 0, .. } => "catching up".to_string(),
        StandbyLag { absent_ms, .. } => format!("absent for {} s", absent_ms / 1000),
    };
    format!("{state} ({} B behind)", standby.lag_bytes)
}

async fn list(context: &Context, live: bool) -> Result<(), Failure> {
    let queues = context.api()?.queues().await?;
    let mut headers = QUEUE_COLUMNS.to_vec();
    if live {
        headers.extend(LIVE_COLUMNS);
    }
    let rows = queues.iter().map(|q| queue_row(q, live)).collect();
    Output::new(headers, rows, json_of(&queues)).print(context.format);
    Ok(())
}

/// One queue as FIELD, VALUE rows, its live numbers `unknown` when not known.
fn queue_output(queue: &Queue, json: serde_json::Value) -> Output {
    let optional = |value: &Option<String>| value.clone().unwrap_or_else(|| "-".into());
    let mut rows: Vec<Vec<String>> = QUEUE_COLUMNS
        .iter()
        .zip(queue_row(queue, false))
        .map(|(name, value)| vec![name.to_string(), value])
        .collect();
    rows.push(vec!["HOST".into(), queue.host.clone()]);
    rows.push(vec!["IPV4".into(), queue.ipv4.to_string()]);
    rows.push(vec!["REPLICAS".into(), queue.replicas.to_string()]);
    let epoch = match queue.replicas {
        2.. => queue.epoch.to_string(),
        _ => "-".into(),
    };
    rows.push(vec!["EPOCH".into(), epoch]);
    // Which machine serves (the other holds the standby), for a queue with two.
    let serving = match (queue.replicas, &queue.serving) {
        (2.., Some(slot)) => slot.clone(),
        _ => "-".into(),
    };
    rows.push(vec!["SERVING".into(), serving]);
    rows.push(vec!["NODE".into(), optional(&queue.node)]);
    rows.push(vec!["ACCOUNT".into(), optional(&queue.account)]);
    rows.push(vec!["NAME".into(), optional(&queue.name)]);
    let tags: Vec<String> = queue.tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
    rows.push(vec!["TAGS".into(), tags.join(", ")]);
    if let Some(failure) = &queue.failure {
        rows.push(vec!["FAILURE".into(), failure.reason.clone()]);
    }
    if let Some(build) = &queue.node_build {
        let shown = format!("{} ({})", build.version, build.binary_sha256);
        rows.push(vec!["NODE BUILD".into(), shown]);
    }
    if let Some(build) = &queue.desired_build {
        rows.push(vec!["TOLD TO RUN".into(), build.binary_sha256.clone()]);
    }
    match &queue.live {
        Some(_) => rows.extend(
            LIVE_COLUMNS
                .iter()
                .zip(live_cells(queue))
                .map(|(name, value)| vec![name.to_string(), value]),
        ),
        None => rows.push(vec!["LIVE".into(), "unknown".into()]),
    }
    Output::new(vec!["FIELD", "VALUE"], rows, json)
}

async fn get(context: &Context, id: &str) -> Result<(), Failure> {
    let queue = context.api()?.queue(id).await?;
    queue_output(&queue, json_of(&queue)).print(context.format);
    Ok(())
}

/// Makes the queue, keeps its three logins in the profile at once (the API shows them only
/// this once), then waits until it runs unless told not to.
async fn create(context: &mut Context, new: &NewQueue, wait: bool) -> Result<(), Failure> {
    let api = context.api()?;
    let CreatedQueue { queue, logins } = api.create_queue(new).await?;
    let kept = QueueLogins {
        url: Some(queue.url.clone()),
        publisher: Some(logins.publisher.clone()),
        subscriber: Some(logins.subscriber.clone()),
        admin: Some(logins.admin.clone()),
    };
    context.profile_mut()?.queues.insert(queue.id.clone(), kept);
    context.save()?;
    let queue = match wait {
        true => until_running_or_failed(&api, &queue.id).await?,
        false => queue,
    };
    if let Some(saved) = context.profile_mut()?.queues.get_mut(&queue.id) {
        saved.url = Some(queue.url.clone());
    }
    context.save()?;
    let json = json!({"queue": queue, "logins": logins});
    queue_output(&queue, json).print(context.format);
    eprintln!(
        "its three logins are kept in profile {:?} ({})",
        context.profile_name,
        context.path.display()
    );
    match (wait, queue.status, &queue.failure) {
        (false, _, _) | (true, QueueStatus::Running, _) => Ok(()),
        (true, QueueStatus::Failed, Some(failure)) => Err(Failure::Refused {
            code: None,
            message: format!("queue {} failed: {}", queue.id, failure.reason),
        }),
        (true, status, _) => Err(Failure::Unavailable(format!(
            "queue {} is {} after {CREATE_WITHIN:?}, not running",
            queue.id,
            name_of(&status)
        ))),
    }
}

/// The queue once it runs or has failed, or as it is after [`CREATE_WITHIN`]: asked in short
/// holds, so a queue that fails is told at once, not after the whole wait.
async fn until_running_or_failed(api: &ControlPlane, id: &str) -> Result<Queue, Failure> {
    let deadline = tokio::time::Instant::now() + CREATE_WITHIN;
    loop {
        let queue = api
            .wait_for_queue(id, QueueStatus::Running, Duration::from_secs(5))
            .await?;
        let settled = matches!(queue.status, QueueStatus::Running | QueueStatus::Failed);
        if settled || tokio::time::Instant::now() >= deadline {
            return Ok(queue);
        }
    }
}

/// Deletes the queue and forgets its logins.
async fn delete(context: &mut Context, id: &str) -> Result<(), Failure> {
    let queue = context.api()?.delete_queue(id).await?;
    if context.profile_mut()?.queues.remove(id).is_some() {
        context.save()?;
    }
    queue_output(&queue, json_of(&queue)).print(context.format);
    Ok(())
}

/// `qe logins rotate`: a new password, kept in the profile.
pub async fn logins(context: &mut Context, command: LoginsCommand) -> Result<(), Failure> {
    let LoginsCommand::Rotate { queue, role } = command;
    let role = role.role();
    let rotated = context.api()?.rotate_login(&queue, role).await?;
    context
        .profile_mut()?
        .queues
        .entry(queue.clone())
        .or_default()
        .set_login(role, rotated.credentials());
    context.save()?;
    let applied = match rotated.applied {
        true => "yes",
        false => "pending (the node has not confirmed it yet)",
    };
    Output::new(
        vec!["QUEUE", "ROLE", "USERNAME", "APPLIED"],
        vec![vec![
            queue.clone(),
            role.name().to_string(),
            rotated.username.clone(),
            applied.to_string(),
        ]],
        json!({"queue": queue, "role": role.name(), "login": rotated}),
    )
    .print(context.format);
    eprintln!(
        "the new password is kept in profile {:?}",
        context.profile_name
    );
    Ok(())
}

fn record_query(range: RangeArgs) -> RecordQuery {
    RecordQuery {
        from: range.from,
        to: range.to,
        queue: range.queue,
        account: None,
    }
}

/// `qe usage`: the usage records, a line each.
pub async fn usage(context: &Context, range: RangeArgs) -> Result<(), Failure> {
    let records = context.api()?.usage(&record_query(range)).await?;
    let rows = records
        .iter()
        .map(|r| {
            vec![
                r.queue.clone(),
                utc(r.time),
                r.network_sent.to_string(),
                r.network_received.to_string(),
                r.storage_written.to_string(),
                r.storage_read.to_string(),
                r.storage_held.to_string(),
                r.instance_type.clone(),
                r.region.clone(),
                r.ipv4.to_string(),
            ]
        })
        .collect();
    let headers = vec![
        "QUEUE", "TIME", "SENT", "RECEIVED", "WRITTEN", "READ", "HELD", "TYPE", "REGION", "IPV4",
    ];
    Output::new(headers, rows, json_of(&records)).print(context.format);
    Ok(())
}

/// `qe stats`: the stats records, a line each.
pub async fn stats(context: &Context, range: RangeArgs) -> Result<(), Failure> {
    let records = context.api()?.stats(&record_query(range)).await?;
    let rows = records
        .iter()
        .map(|r| {
            let numbers = [
                r.messages,
                r.publishers,
                r.subscribers,
                r.saved_subscribers,
                r.administrators,
                r.unacknowledged,
                r.dead_letter,
                r.delayed,
                r.durable,
            ];
            let mut row = vec![r.queue.clone(), utc(r.time)];
            row.extend(numbers.iter().map(u64::to_string));
            row
        })
        .collect();
    let headers = vec![
        "QUEUE",
        "TIME",
        "MESSAGES",
        "PUBLISHERS",
        "SUBSCRIBERS",
        "SAVED",
        "ADMINS",
        "UNACKED",
        "DLQ",
        "DELAYED",
        "DURABLE",
    ];
    Output::new(headers, rows, json_of(&records)).print(context.format);
    Ok(())
}

/// `qe bills`: the month's lines, then the total.
pub async fn bills(context: &Context, args: BillArgs) -> Result<(), Failure> {
    let bill = context
        .api()?
        .bill(args.month.as_deref(), args.queue.as_deref(), None)
        .await?;
    let mut rows: Vec<Vec<String>> = bill
        .lines
        .iter()
        .map(|line| {
            vec![
                line.queue.clone(),
                line.item.clone(),
                format!("{} {}", line.quantity, line.unit),
                format!("{:.6}", line.unit_price),
                format!("{:.6}", line.amount),
            ]
        })
        .collect();
    rows.push(vec![
        "total".into(),
        bill.month.clone(),
        String::new(),
        String::new(),
        format!("{:.6}", bill.total),
    ]);
    let headers = vec!["QUEUE", "ITEM", "QUANTITY", "UNIT PRICE", "AMOUNT"];
    Output::new(headers, rows, json_of(&bill)).print(context.format);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standby_cell_says_whether_it_is_in_sync_catching_up_or_absent() {
        let standby = |in_sync, lag_bytes, absent_ms| {
            Some(StandbyLag {
                in_sync,
                lag_bytes,
                absent_ms,
            })
        };
        assert_eq!(standby_cell(standby(true, 10, 0)), "in sync (10 B behind)");
        assert_eq!(
            standby_cell(standby(false, 500, 0)),
            "catching up (500 B behind)"
        );
        assert_eq!(
            standby_cell(standby(false, 500, 61_999)),
            "absent for 61 s (500 B behind)"
        );
        assert_eq!(standby_cell(None), "-");
    }
}
