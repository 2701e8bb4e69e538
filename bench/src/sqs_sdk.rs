//! `bench sqs-sdk`: SQS throughput through Amazon's Rust SDK (`aws-sdk-sqs`) against a node's
//! SQS face, the same four measurements as bench/sqs/boto3_throughput.py (scripts/bench-sqs
//! starts the node and runs both): SendMessage one at a time, SendMessageBatch of 10, and
//! ReceiveMessage of up to 10 with DeleteMessageBatch of what came, by 1 and 8 concurrent
//! tasks sharing one client (as the SDK is meant to be used). 100-byte bodies. Every message
//! sent is received and deleted exactly once (checked), and the queue is empty at the end.
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
}

pub async fn sqs_sdk(settings: &Settings) {
    let setup: serde_json::Value =
        serde_json::from_str(&std::env::var("QE_SQS").expect("QE_SQS")).expect("QE_SQS is JSON");
    let client = client(&setup);
    let url = client.get_queue_url().queue_name("queue").send().await;
    let url = url.expect("the queue").queue_url.expect("its URL");
    let total = settings.messages;
    println!(
        "{:>7} {:>12} {:>17} {:>20}  (messages/s, {total} messages each, aws-sdk-sqs)",
        "tasks", "SendMessage", "SendMessageBatch", "Receive+DeleteBatch"
    );
    for tasks in [1, 8] {
        let share = total / tasks;
        let (sent_one, _) = in_tasks(tasks, |_| send_one(&client, &url, share)).await;
        let (received_one, seen_one) =
            in_tasks(tasks, |_| receive_and_delete(&client, &url, share)).await;
        let (sent_batch, _) = in_tasks(tasks, |_| send_batches(&client, &url, share)).await;
        let (received_batch, seen_batch) =
            in_tasks(tasks, |_| receive_and_delete(&client, &url, share)).await;
        for seen in [seen_one, seen_batch] {
            let ids: Vec<String> = seen.into_iter().flatten().collect();
            let distinct: HashSet<&String> = ids.iter().collect();
            assert_eq!((ids.len(), distinct.len()), (share * tasks, share * tasks));
        }
        assert_eq!(depth(&client, &url).await, 0, "the queue is empty");
        let rate = |took: Duration| (share * tasks) as f64 / took.as_secs_f64();
        let receive_rate =
            2.0 * (share * tasks) as f64 / (received_one + received_batch).as_secs_f64();
        println!(
            "{tasks:>7} {:>12.0} {:>17.0} {receive_rate:>20.0}",
            rate(sent_one),
            rate(sent_batch)
        );
    }
}

/// A client of plain HTTP to the endpoint (the node's TLS is not what is measured), without
/// retries: a refusal fails the run.
fn client(setup: &serde_json::Value) -> Client {
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

async fn send_one(client: &Client, url: &str, count: usize) {
    for _ in 0..count {
        let sent = client
            .send_message()
            .queue_url(url)
            .message_body(BODY.as_str());
        sent.send().await.expect("SendMessage");
    }
}

async fn send_batches(client: &Client, url: &str, count: usize) {
    for start in (0..count).step_by(10) {
        let mut batch = client.send_message_batch().queue_url(url);
        for n in 0..(count - start).min(10) {
            let entry = SendMessageBatchRequestEntry::builder()
                .id(n.to_string())
                .message_body(BODY.as_str())
                .build()
                .expect("an entry");
            batch = batch.entries(entry);
        }
        let sent = batch.send().await.expect("SendMessageBatch");
        assert!(sent.failed().is_empty(), "{sent:?}");
    }
}

/// Receives and deletes until `count` came or three receives of a second found nothing; the
/// ids received.
async fn receive_and_delete(client: &Client, url: &str, count: usize) -> Vec<String> {
    let (mut seen, mut idle) = (Vec::with_capacity(count), 0);
    while seen.len() < count && idle < 3 {
        let received = client
            .receive_message()
            .queue_url(url)
            // No more than its share: a task that took another's would leave that one
            // long-polling an empty queue inside the timing.
            .max_number_of_messages((count - seen.len()).min(10) as i32)
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
