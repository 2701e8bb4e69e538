"""SQS throughput through boto3 against a node's SQS face (scripts/bench-sqs starts the node).

For each of 1 and 8 client threads (each with its own boto3 client, as boto3 wants): SendMessage
one at a time, SendMessageBatch of 10, then ReceiveMessage of up to 10 with DeleteMessageBatch of
what came; messages per second for each. 100-byte bodies. Every message sent is received and
deleted exactly once (checked), and the queue is empty at the end.
"""

import json
import os
import sys
import threading
import time

import boto3
import botocore.config

SETUP = json.loads(os.environ["QE_SQS"])
MESSAGES = int(os.environ.get("QE_SQS_MESSAGES", "4000"))
BODY = "x" * 100


def client():
    key = SETUP["key"]
    return boto3.client("sqs", endpoint_url=SETUP["endpoint"], region_name="eu-west-1",
                        aws_access_key_id=key[0], aws_secret_access_key=key[1],
                        config=botocore.config.Config(retries={"max_attempts": 0},
                                                      max_pool_connections=4))


def in_threads(threads, work):
    """Runs work(client, share) in `threads` threads, each its share of MESSAGES; seconds."""
    clients = [client() for _ in range(threads)]
    for sqs in clients:
        sqs.list_queues()  # connections and credentials warmed up outside the timing
    share = MESSAGES // threads
    results = [None] * threads

    def run(n):
        results[n] = work(clients[n], share)

    workers = [threading.Thread(target=run, args=(n,)) for n in range(threads)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return time.perf_counter() - started, results, share * threads


def send_one(sqs, count):
    for _ in range(count):
        sqs.send_message(QueueUrl=URL, MessageBody=BODY)


def send_batches(sqs, count):
    for start in range(0, count, 10):
        entries = [{"Id": str(n), "MessageBody": BODY} for n in range(min(10, count - start))]
        result = sqs.send_message_batch(QueueUrl=URL, Entries=entries)
        assert not result.get("Failed"), result


def receive_and_delete(sqs, count):
    seen = []
    idle = 0
    while len(seen) < count and idle < 3:
        # No more than its share: a thread that took another's would leave that one
        # long-polling an empty queue inside the timing.
        messages = sqs.receive_message(QueueUrl=URL, MaxNumberOfMessages=min(10, count - len(seen)),
                                       VisibilityTimeout=300, WaitTimeSeconds=1).get("Messages", [])
        if not messages:
            idle += 1
            continue
        idle = 0
        entries = [{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(messages)]
        result = sqs.delete_message_batch(QueueUrl=URL, Entries=entries)
        assert not result.get("Failed"), result
        seen.extend(m["MessageId"] for m in messages)
    return seen


def depth(sqs):
    shown = sqs.get_queue_attributes(QueueUrl=URL, AttributeNames=["All"])["Attributes"]
    return int(shown["ApproximateNumberOfMessages"]) + int(shown["ApproximateNumberOfMessagesNotVisible"])


admin = client()
URL = admin.get_queue_url(QueueName="queue")["QueueUrl"]
print(f"{'threads':>7} {'SendMessage':>12} {'SendMessageBatch':>17} {'Receive+DeleteBatch':>20}  (messages/s, {MESSAGES} messages each)")
for threads in [1, 8]:
    sent_one, _, total = in_threads(threads, send_one)
    received_one, seen_one, _ = in_threads(threads, receive_and_delete)
    sent_batch, _, _ = in_threads(threads, send_batches)
    received_batch, seen_batch, _ = in_threads(threads, receive_and_delete)
    for seen in [seen_one, seen_batch]:
        ids = [i for share in seen for i in share]
        assert len(ids) == total and len(set(ids)) == total, (len(ids), len(set(ids)), total)
    assert depth(admin) == 0
    receive_rate = 2 * total / (received_one + received_batch)
    print(f"{threads:>7} {total / sent_one:>12.0f} {total / sent_batch:>17.0f} {receive_rate:>20.0f}", flush=True)
