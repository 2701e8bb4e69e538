"""What one request of each SQS action costs the node: its CPU time and system calls.

scripts/bench-sqs runs this after its throughput runs (the node it started, QE_SQS and
QE_SQS_NODE_PID). One boto3 client sends requests one at a time, action by action:
SendMessage, ReceiveMessage of 1, DeleteMessage, then SendMessageBatch of 10, ReceiveMessage
of 10 and DeleteMessageBatch of 10. Around each, `perf stat -p` counts the node's task-clock,
the system calls that matter here and its context switches; each is printed per request.
  QE_SQS_REQUESTS=1000 (requests of the single actions; a tenth as many of the batches)
"""

import json
import os
import signal
import subprocess
import tempfile
import time

import boto3
import botocore.config

SETUP = json.loads(os.environ["QE_SQS"])
NODE = os.environ["QE_SQS_NODE_PID"]
REQUESTS = int(os.environ.get("QE_SQS_REQUESTS", "1000"))
BODY = "x" * 100
EVENTS = ["task-clock"] + [f"syscalls:sys_enter_{call}" for call in (
    "recvfrom", "writev", "pwrite64", "epoll_wait", "write", "futex", "getrandom")] + [
    "context-switches"]


def counted(name, request, times):
    """Runs `request` `times` times under `perf stat` of the node; prints what one cost."""
    with tempfile.NamedTemporaryFile(mode="r", suffix=".perf") as out:
        perf = subprocess.Popen(["perf", "stat", "-x,", "-e", ",".join(EVENTS), "-p", NODE,
                                 "-o", out.name])
        time.sleep(0.5)  # perf attached
        for _ in range(times):
            request()
        perf.send_signal(signal.SIGINT)
        perf.wait()
        counts = {}
        for line in out:
            fields = line.strip().split(",")
            if len(fields) > 2 and fields[0][:1].isdigit():
                counts[fields[2].split(":")[-1].replace("sys_enter_", "")] = float(fields[0])
    cpu_us = counts.pop("task-clock") * 1000 / times
    rest = "  ".join(f"{event} {count / times:.2f}" for event, count in counts.items())
    print(f"{name:<20} {cpu_us:7.1f} us   {rest}", flush=True)


def main():
    key = SETUP["key"]
    sqs = boto3.client("sqs", endpoint_url=SETUP["endpoint"], region_name="eu-west-1",
                       aws_access_key_id=key[0], aws_secret_access_key=key[1],
                       config=botocore.config.Config(retries={"max_attempts": 0}))
    url = sqs.get_queue_url(QueueName="queue")["QueueUrl"]
    batches = max(REQUESTS // 10, 1)
    # A warm-up, and time for a node just started to make its spare log segment (its 16 KiB
    # writes of zeros would be counted as the first action's).
    for _ in range(50):
        sqs.send_message(QueueUrl=url, MessageBody=BODY)
        for message in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                           VisibilityTimeout=600).get("Messages", []):
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    time.sleep(2)
    print(f"node CPU (task-clock) and system calls a request, {REQUESTS} requests of each single "
          f"action and {batches} of each batch of 10, one at a time (boto3)")
    handles = []

    def receive(count):
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=count,
                                  VisibilityTimeout=600)
        handles.append([m["ReceiptHandle"] for m in got.get("Messages", [])])
        assert len(handles[-1]) == count, got

    counted("SendMessage", lambda: sqs.send_message(QueueUrl=url, MessageBody=BODY), REQUESTS)
    counted("ReceiveMessage (1)", lambda: receive(1), REQUESTS)
    single = iter([handle for [handle] in handles])
    counted("DeleteMessage", lambda: sqs.delete_message(QueueUrl=url, ReceiptHandle=next(single)),
            REQUESTS)
    entries = [{"Id": str(n), "MessageBody": BODY} for n in range(10)]
    counted("SendMessageBatch", lambda: sqs.send_message_batch(QueueUrl=url, Entries=entries),
            batches)
    handles.clear()
    counted("ReceiveMessage (10)", lambda: receive(10), batches)
    tens = iter(handles)

    def delete_batch():
        entries = [{"Id": str(n), "ReceiptHandle": h} for n, h in enumerate(next(tens))]
        answer = sqs.delete_message_batch(QueueUrl=url, Entries=entries)
        assert len(answer.get("Successful", [])) == 10, answer

    counted("DeleteMessageBatch", delete_batch, batches)


if __name__ == "__main__":
    main()
