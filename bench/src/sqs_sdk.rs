//! `bench sqs-sdk`: SQS throughput through Amazon's Rust SDK (`aws-sdk-sqs`) against a node's
//! SQS face, the same four measurements as bench/sqs/boto3_throughput.py (scripts/bench-sqs
//! starts the node and runs both): SendMessage one at a time, SendMessageBatch of 10, and
//! ReceiveMessage of up to 10 with DeleteMessageBatch of what came, by 1 and 8 concurrent
//! tasks sharing one client (as the SDK is meant to be used). 100-byte bodies. Every message
//! sent is received and deleted exactly once (checked), and the queue is empty at the end.
//!
//! With `--groups N` every message has a `MessageGroupId` (N groups, round robin) and a
//! deduplication id of its own, as a FIFO queue takes them (scripts/bench-sqs makes the node's
//! queue a FIFO queue for that run): each group's messages are received one at a time, so
//! the receivers share one count of what is left instead of a share each.
//!
//! The endpoint and key come as JSON in QE_SQS: `{"endpoint": URL, "key": [ID, SECRET]}`.

use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, QueueAttributeName, SendMessageBatchRequestEntry,
};
use aws_sdk_sqs::Client;
use std::collections::HashSet;
use std::future::Future;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

/// Every body: 100 bytes, as boto3's measurement sends.
static BODY: LazyLock<String> = LazyLock::new(|| "x".repeat(100));

#[derive(clap::Args)]
pub struct Settings {
    /// Messages per measurement.
    #[arg(long, default_value_t = 4000)]
    messages: usize,
    /// Message groups the messages are spread over (0: none, a standard queue's sends).
    #[arg(long, default_value_t = 0)]
    groups: usize,
}

pub async fn sqs_sdk(settings: &Settings) {
    let setup: serde_json::Value =
        serde_json::from_str(&std::env::var("QE_SQS").expect("QE_SQS")).expect("QE_SQS is JSON");
    let client = client(&setup);
    let url = client.get_queue_url().queue_name("queue").send().await;
    let url = url.expect("the queue").queue_url.expect("its URL");
    let total = settings.messages;
    let groups = settings.groups;
    let kind = match groups {
        0 => "standard".to_string(),
        n => format!("FIFO, {n} groups"),
    };
    println!(
        "{:>7} {:>12} {:>17} {:>20} {:>13} {:>13}  (messages/s, {total} messages each, aws-sdk-sqs, \
         {kind}; node CPU per message sent, received and deleted, in µs, with single sends and \
         with batched sends)",
        "tasks", "SendMessage", "SendMessageBatch", "Receive+DeleteBatch", "cpu/msg one", "cpu/msg batch"
    );
    let sends = std::sync::atomic::AtomicUsize::new(0);
    let sending = Sending {
        groups,
        sends: &sends,
    };
    for tasks in [1, 8] {
        let share = total / tasks;
        // What the receivers have left to take, shared (read with groups only), and when the
        // last was deleted: with groups the receivers stop together, and those long-polling
        // for messages that no longer come are not timed.
        let left = std::sync::atomic::AtomicUsize::new(share * tasks);
        let last = std::sync::Mutex::new(None);
        let receive = |_| receive_and_delete(&client, &url, share, groups, &left, &last);
        let timed = |(took, seen): (Duration, Vec<Vec<String>>), started: Instant| {
            let last: Option<Instant> = *last.lock().unwrap();
            let took = last.map_or(took, |last| took.min(last - started));
            (took, seen)
        };
        let cpu_before = node_cpu();
        let (sent_one, _) = in_tasks(tasks, |_| send_one(&client, &url, share, &sending)).await;
        let started = Instant::now();
        let (received_one, seen_one) = timed(in_tasks(tasks, receive).await, started);
        let cpu_one = node_cpu() - cpu_before;
        left.store(share * tasks, std::sync::atomic::Ordering::SeqCst);
        *last.lock().unwrap() = None;
        let cpu_before = node_cpu();
        let (sent_batch, _) =
            in_tasks(tasks, |_| send_batches(&client, &url, share, &sending)).await;
        let started = Instant::now();
        let (received_batch, seen_batch) = timed(in_tasks(tasks, receive).await, started);
        let cpu_batch = node_cpu() - cpu_before;
        for seen in [seen_one, seen_batch] {
            let ids: Vec<String> = seen.into_iter().flatten().collect();
            let distinct: HashSet<&String> = ids.iter().collect();
            assert_eq!((ids.len(), distinct.len()), (share * tasks, share * tasks));
        }
        assert_eq!(depth(&client, &url).await, 0, "the queue is empty");
        let rate = |took: Duration| (share * tasks) as f64 / took.as_secs_f64();
        let receive_rate =
            2.0 * (share * tasks) as f64 / (received_one + received_batch).as_secs_f64();
        let per_message = |cpu: Duration| cpu.as_secs_f64() * 1e6 / (share * tasks) as f64;
        println!(
            "{tasks:>7} {:>12.0} {:>17.0} {receive_rate:>20.0} {:>13.1} {:>13.1}",
            rate(sent_one),
            rate(sent_batch),
            per_message(cpu_one),
            per_message(cpu_batch),
        );
    }
}

/// The node's CPU time so far, when `QE_SQS_NODE_PID` names it (scripts/bench-sqs does);
/// zero otherwise (the columns then read 0).
fn node_cpu() -> Duration {
    match std::env::var("QE_SQS_NODE_PID")
        .ok()
        .and_then(|pid| pid.parse().ok())
    {
        Some(pid) => crate::node::cpu_time(pid),
        None => Duration::ZERO,
    }
}

/// A client of plain HTTP to the endpoint (the node's TLS is not what is measured), without
/// retries: a refusal fails the run.
pub(crate) fn client(setup: &serde_json::Value) -> Client {
    let key = &setup["key"];
    let credentials = Credentials::new(
        key[0].as_str().expect("a key id"),
        key[1].as_str().expect("a secret"),
        None,
        None,
        "bench",
    );
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("eu-west-1"))
        .credentials_provider(credentials)
        .endpoint_url(setup["endpoint"].as_str().expect("an endpoint"))
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .retry_config(aws_sdk_sqs::config::retry::RetryConfig::disabled())
        .build();
    Client::from_conf(config)
}

/// Runs `work(n)` for n in 0..tasks concurrently; how long they took, and what each gave.
async fn in_tasks<F, T>(tasks: usize, work: impl Fn(usize) -> F) -> (Duration, Vec<T>)
where
    F: Future<Output = T>,
{
    let started = Instant::now();
    let results = futures::future::join_all((0..tasks).map(work)).await;
    (started.elapsed(), results)
}

/// What every send carries: with groups, the next group round robin and a deduplication id
/// of its own (the count of sends so far).
struct Sending<'a> {
    groups: usize,
    sends: &'a std::sync::atomic::AtomicUsize,
}

impl Sending<'_> {
    /// The group and deduplication id of the next send, if messages have groups.
    fn next(&self) -> Option<(String, String)> {
        let n = self
            .sends
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // (The process's id in it: a run within five minutes of another must not repeat its
        // ids, or its sends would be taken as repeats and make nothing.)
        let run = std::process::id();
        (self.groups > 0).then(|| (format!("g{}", n % self.groups), format!("m{run}-{n}")))
    }
}

async fn send_one(client: &Client, url: &str, count: usize, sending: &Sending<'_>) {
    for _ in 0..count {
        let mut sent = client
            .send_message()
            .queue_url(url)
            .message_body(BODY.as_str());
        if let Some((group, dedup)) = sending.next() {
            sent = sent.message_group_id(group).message_deduplication_id(dedup);
        }
        sent.send().await.expect("SendMessage");
    }
}

async fn send_batches(client: &Client, url: &str, count: usize, sending: &Sending<'_>) {
    for start in (0..count).step_by(10) {
        let mut batch = client.send_message_batch().queue_url(url);
        for n in 0..(count - start).min(10) {
            let mut entry = SendMessageBatchRequestEntry::builder()
                .id(n.to_string())
                .message_body(BODY.as_str());
            if let Some((group, dedup)) = sending.next() {
                entry = entry
                    .message_group_id(group)
                    .message_deduplication_id(dedup);
            }
            let entry = entry.build().expect("an entry");
            batch = batch.entries(entry);
        }
        let sent = batch.send().await.expect("SendMessageBatch");
        assert!(sent.failed().is_empty(), "{sent:?}");
    }
}

/// Receives and deletes until `count` came (with groups: until `left`, shared by the
/// receivers, is used up) or three receives of a second found nothing; the ids received.
async fn receive_and_delete(
    client: &Client,
    url: &str,
    count: usize,
    groups: usize,
    left: &std::sync::atomic::AtomicUsize,
    last: &std::sync::Mutex<Option<Instant>>,
) -> Vec<String> {
    use std::sync::atomic::Ordering;
    let (mut seen, mut idle) = (Vec::with_capacity(count), 0);
    let more = |seen: &Vec<String>| match groups {
        0 => seen.len() < count,
        _ => left.load(Ordering::SeqCst) > 0,
    };
    while more(&seen) && idle < 3 {
        let wanted = match groups {
            // No more than its share: a task that took another's would leave that one
            // long-polling an empty queue inside the timing.
            0 => (count - seen.len()).min(10),
            _ => 10,
        };
        let received = client
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(wanted as i32)
            .visibility_timeout(300)
            .wait_time_seconds(1)
            .send()
            .await
            .expect("ReceiveMessage");
        let messages = received.messages();
        if messages.is_empty() {
            idle += 1;
            continue;
        }
        idle = 0;
        let mut deletes = client.delete_message_batch().queue_url(url);
        for (n, message) in messages.iter().enumerate() {
            let entry = DeleteMessageBatchRequestEntry::builder()
                .id(n.to_string())
                .receipt_handle(message.receipt_handle().expect("a handle"))
                .build()
                .expect("an entry");
            deletes = deletes.entries(entry);
        }
        let deleted = deletes.send().await.expect("DeleteMessageBatch");
        assert!(deleted.failed().is_empty(), "{deleted:?}");
        if left.fetch_sub(messages.len(), Ordering::SeqCst) == messages.len() {
            *last.lock().unwrap() = Some(Instant::now());
        }
        seen.extend(
            messages
                .iter()
                .filter_map(|m| m.message_id().map(str::to_string)),
        );
    }
    seen
}

/// Messages visible and in flight.
async fn depth(client: &Client, url: &str) -> u64 {
    let shown = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::All)
        .send()
        .await
        .expect("GetQueueAttributes");
    let shown = shown.attributes().expect("attributes");
    let number = |name: QueueAttributeName| shown[&name].parse::<u64>().expect("a number");
    number(QueueAttributeName::ApproximateNumberOfMessages)
        + number(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
}
