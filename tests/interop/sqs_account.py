"""The control plane's SQS endpoint with real AWS clients, as an application written for SQS
uses it: boto3 with only `endpoint_url` and the credentials changed creates queues, sends,
receives, deletes, tags, lists by prefix and page, and deletes queues; the AWS CLI does the
same round trip. tests/tests/sqs_account.rs starts the control plane (local provider) and
makes the account's keys; the setup comes as JSON in QE_SQS: the endpoint and the keys by
role. Each check prints one `ok` line; any failure raises.

`python sqs_account.py boto3` runs the boto3 checks, `cli` the AWS CLI's, `query` the ones an
SDK of the query protocol can make (boto3 1.26 in its own venv).
"""

import json
import os
import sys
import threading
import time

import boto3
import botocore.config
from sqs_common import aws_cli, error_code

SETUP = json.loads(os.environ["QE_SQS"])
ENDPOINT = SETUP["endpoint"]
REGION = "local"


def check(name, detail=""):
    print(f"ok {name}{': ' + detail if detail else ''}", flush=True)


def client(role, endpoint=ENDPOINT, retries=None):
    """boto3 with `role`'s key; no retries unless asked (a refusal is seen as it comes)."""
    key = SETUP["keys"][role]
    return boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=key[0],
        aws_secret_access_key=key[1],
        config=botocore.config.Config(retries=retries or {"max_attempts": 0}, read_timeout=60),
    )


def boto3_checks():
    sqs = client("admin")
    publisher = client("publisher")
    prefix = SETUP["prefix"]
    orders = f"{prefix}-orders"
    attributes = {
        "VisibilityTimeout": "45",
        "MessageRetentionPeriod": "86400",
        "ReceiveMessageWaitTimeSeconds": "2",
        "RedrivePolicy": json.dumps({"maxReceiveCount": "3"}),
    }
    made = sqs.create_queue(QueueName=orders, Attributes=attributes, tags={"team": "payments"})
    url = made["QueueUrl"]
    request_id = made["ResponseMetadata"]["RequestId"]
    assert len(request_id) == 36, made["ResponseMetadata"]
    queue_id = url.rstrip("/").rsplit("/", 1)[1]
    check("create_queue answers the queue's URL on its node", url)

    again = sqs.create_queue(QueueName=orders, Attributes=attributes)
    assert again["QueueUrl"] == url, (again, url)
    other = dict(attributes, VisibilityTimeout="46")
    code = error_code(lambda: sqs.create_queue(QueueName=orders, Attributes=other))
    assert code == "QueueAlreadyExists", code
    check("create_queue is idempotent by name; other attributes are QueueAlreadyExists")

    # Eight creates of one new name at once (no retries): one queue, every reply its URL.
    race = f"{prefix}-race"
    answers = []
    def create_race():
        answers.append(client("admin").create_queue(QueueName=race)["QueueUrl"])
    threads = [threading.Thread(target=create_race) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(answers) == 8 and len(set(answers)) == 1, answers
    sqs.delete_queue(QueueUrl=answers[0])
    check("eight creates of one name at once make one queue", answers[0])

    for bad, expected in [
        ("has space", "InvalidParameterValue"),
        ("x" * 81, "InvalidParameterValue"),
    ]:
        code = error_code(lambda: sqs.create_queue(QueueName=bad))
        assert code == expected, (bad, code)
    code = error_code(lambda: sqs.create_queue(QueueName=f"{prefix}-x", Attributes={"Policy": "{}"}))
    assert code == "InvalidAttributeName", code
    code = error_code(
        lambda: sqs.create_queue(QueueName=f"{prefix}-x", Attributes={"VisibilityTimeout": "99999"})
    )
    assert code == "InvalidAttributeValue", code
    code = error_code(lambda: publisher.create_queue(QueueName=f"{prefix}-x"))
    assert code == "AccessDenied", code
    check("names, attributes and roles are refused with AWS's codes")

    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert got["VisibilityTimeout"] == "45", got
    assert got["MessageRetentionPeriod"] == "86400", got
    assert got["MaximumMessageSize"] == "262144", got
    assert got["ReceiveMessageWaitTimeSeconds"] == "2", got
    assert got["DelaySeconds"] == "0", got
    assert json.loads(got["RedrivePolicy"])["maxReceiveCount"] == 3, got
    check("the attributes it was made with are the node's settings (256 KiB messages by default)")

    # Every queue action through the control plane's endpoint: handed on to the node.
    sent = publisher.send_message(QueueUrl=url, MessageBody="first order")
    batch = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[{"Id": str(n), "MessageBody": f"order {n}"} for n in range(3)],
    )
    assert len(batch["Successful"]) == 3, batch
    bodies = []
    deadline = time.time() + 20
    while len(bodies) < 4 and time.time() < deadline:
        received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=2)
        for message in received.get("Messages", []):
            bodies.append(message["Body"])
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    assert sorted(bodies) == ["first order", "order 0", "order 1", "order 2"], bodies
    assert sent["MessageId"]
    empty = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0).get("Messages", [])
    assert empty == [], empty
    check("send, batch, receive and delete through the endpoint, by the URL it gave")

    # The URL itself serves too (the JavaScript SDK calls it), with the account's key.
    direct = client("publisher", endpoint=url.rsplit("/", 1)[0])
    direct.send_message(QueueUrl=url, MessageBody="straight to the node")
    received = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"]
    assert received[0]["Body"] == "straight to the node", received
    sqs.delete_message(QueueUrl=url, ReceiptHandle=received[0]["ReceiptHandle"])
    check("the node takes the account's keys at the queue's URL")

    # The dead letter queue (the queue's own, as its RedrivePolicy names it) moved back.
    dlq_arn = json.loads(sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["RedrivePolicy"])["Attributes"]["RedrivePolicy"])["deadLetterTargetArn"]
    sqs.send_message(QueueUrl=url, MessageBody="fails three times")
    for _ in range(3):
        got = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0, WaitTimeSeconds=5)["Messages"]
        assert got[0]["Body"] == "fails three times", got
    deadline = time.time() + 10
    while time.time() < deadline:
        shown = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        if shown["ApproximateNumberOfMessages"] == "0" and shown["ApproximateNumberOfMessagesNotVisible"] == "0":
            break
        time.sleep(0.1)
    assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0).get("Messages", []) == []
    task = sqs.start_message_move_task(SourceArn=dlq_arn, MaxNumberOfMessagesPerSecond=10)["TaskHandle"]
    back = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"]
    assert [m["Body"] for m in back] == ["fails three times"], back
    sqs.delete_message(QueueUrl=url, ReceiptHandle=back[0]["ReceiptHandle"])
    listed = sqs.list_message_move_tasks(SourceArn=dlq_arn, MaxResults=10)["Results"]
    assert [(t["Status"], t["ApproximateNumberOfMessagesMoved"]) for t in listed] == [("COMPLETED", 1)], listed
    assert error_code(lambda: sqs.cancel_message_move_task(TaskHandle=task)) == "ResourceNotFoundException"
    assert error_code(lambda: sqs.start_message_move_task(SourceArn=dlq_arn.replace("-dlq", "-x-dlq"))) == \
        "AWS.SimpleQueueService.NonExistentQueue"
    assert error_code(lambda: publisher.start_message_move_task(SourceArn=dlq_arn)) == "AccessDenied"
    assert sqs.list_dead_letter_source_queues(QueueUrl=url)["queueUrls"] == []
    check("message move tasks: the dead letter queue moved back, listed COMPLETED; no task to cancel")

    assert sqs.get_queue_url(QueueName=orders)["QueueUrl"] == url
    assert error_code(lambda: sqs.get_queue_url(QueueName=f"{prefix}-none")) == \
        "AWS.SimpleQueueService.NonExistentQueue"
    check("get_queue_url by name; an unknown name is QueueDoesNotExist")

    names = [f"{prefix}-orders-eu", f"{prefix}-billing"]
    urls = {orders: url}
    for name in names:
        urls[name] = sqs.create_queue(QueueName=name)["QueueUrl"]
    listed = sqs.list_queues(QueueNamePrefix=f"{prefix}-orders")["QueueUrls"]
    assert listed == [url, urls[f"{prefix}-orders-eu"]], listed
    pages, token = [], None
    while True:
        arguments = {"QueueNamePrefix": prefix, "MaxResults": 1}
        if token:
            arguments["NextToken"] = token
        page = sqs.list_queues(**arguments)
        pages.append(page["QueueUrls"])
        token = page.get("NextToken")
        if not token:
            break
    assert pages == [[urls[f"{prefix}-billing"]], [url], [urls[f"{prefix}-orders-eu"]]], pages
    paginated = [
        u for page in sqs.get_paginator("list_queues").paginate(QueueNamePrefix=prefix, MaxResults=2)
        for u in page.get("QueueUrls", [])
    ]
    assert len(paginated) == 3, paginated
    check("list_queues by prefix, in pages of MaxResults with NextToken, by boto3's paginator")

    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "payments"}
    sqs.tag_queue(QueueUrl=url, Tags={"env": "test", "team": "orders"})
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"env": "test", "team": "orders"}
    sqs.untag_queue(QueueUrl=url, TagKeys=["env"])
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "orders"}
    code = error_code(lambda: publisher.tag_queue(QueueUrl=url, Tags={"a": "b"}))
    assert code == "AccessDenied", code
    code = error_code(lambda: sqs.tag_queue(QueueUrl=url, Tags={"aws:x": "b"}))
    assert code == "InvalidParameterValue", code
    check("tags: kept with the queue, added, replaced, removed; aws: keys refused")

    eu = urls[f"{prefix}-orders-eu"]
    sqs.delete_queue(QueueUrl=eu)
    assert error_code(lambda: sqs.get_queue_url(QueueName=f"{prefix}-orders-eu")) == \
        "AWS.SimpleQueueService.NonExistentQueue"
    listed = sqs.list_queues(QueueNamePrefix=f"{prefix}-orders")["QueueUrls"]
    assert listed == [url], listed
    again = sqs.create_queue(QueueName=f"{prefix}-orders-eu")["QueueUrl"]
    assert again != eu, (again, eu)
    sqs.delete_queue(QueueUrl=again)
    check("delete_queue: gone from names and lists; its name can be made again")

    unknown = boto3.client(
        "sqs", endpoint_url=ENDPOINT, region_name=REGION,
        aws_access_key_id=SETUP["keys"]["admin"][0], aws_secret_access_key="wrong",
        config=botocore.config.Config(retries={"max_attempts": 0}),
    )
    assert error_code(lambda: unknown.list_queues()) == "SignatureDoesNotMatch"
    check("a wrong secret is SignatureDoesNotMatch")
    print(json.dumps({"queue_id": queue_id, "url": url}))


def cli_checks():
    cli = aws_cli(ENDPOINT, SETUP["keys"]["admin"], REGION)
    name = f"{SETUP['prefix']}-cli"
    url = cli("create-queue", "--queue-name", name, "--tags", "made-by=cli")["QueueUrl"]
    assert cli("get-queue-url", "--queue-name", name)["QueueUrl"] == url
    cli("send-message", "--queue-url", url, "--message-body", "from the aws cli")
    got = cli("receive-message", "--queue-url", url, "--wait-time-seconds", "5")
    assert got["Messages"][0]["Body"] == "from the aws cli", got
    cli("delete-message", "--queue-url", url, "--receipt-handle", got["Messages"][0]["ReceiptHandle"])
    assert cli("list-queue-tags", "--queue-url", url)["Tags"] == {"made-by": "cli"}
    assert url in cli("list-queues", "--queue-name-prefix", name)["QueueUrls"]
    cli("delete-queue", "--queue-url", url)
    assert cli("list-queues", "--queue-name-prefix", name).get("QueueUrls", []) == []
    check("the AWS CLI: create-queue, get-queue-url, send, receive, delete, tags, list, delete-queue")


def query_checks():
    """boto3 1.26 speaks the query protocol: forms in, XML out."""
    sqs = client("admin")
    name = f"{SETUP['prefix']}-query"
    url = sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "40"},
                           tags={"proto": "query"})["QueueUrl"]
    assert sqs.get_queue_url(QueueName=name)["QueueUrl"] == url
    assert sqs.list_queues(QueueNamePrefix=name)["QueueUrls"] == [url]
    sqs.send_message(QueueUrl=url, MessageBody="a <form> & xml")
    got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"]
    assert got[0]["Body"] == "a <form> & xml", got
    sqs.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])
    sqs.tag_queue(QueueUrl=url, Tags={"more": "yes"})
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"proto": "query", "more": "yes"}
    sqs.untag_queue(QueueUrl=url, TagKeys=["proto"])
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"more": "yes"}
    code = error_code(lambda: sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "41"}))
    assert code == "QueueAlreadyExists", code
    sqs.delete_queue(QueueUrl=url)
    assert sqs.list_queues(QueueNamePrefix=name).get("QueueUrls", []) == []
    check("the query protocol: create, get, list, send, receive, tags, delete_queue")


def fifo_checks():
    """A FIFO queue made by CreateQueue: a group on every send, deduplication by content,
    SequenceNumber; four senders at once, each sending every message twice, and three
    receivers at once: no duplicate, never two of a group out, each group in order."""
    sqs = client("admin")
    prefix = SETUP["prefix"]
    assert error_code(lambda: sqs.create_queue(QueueName=f"{prefix}-x.fifo")) == "InvalidParameterValue"
    assert error_code(lambda: sqs.create_queue(
        QueueName=f"{prefix}-x", Attributes={"FifoQueue": "true"})) == "InvalidParameterValue"
    assert error_code(lambda: sqs.create_queue(
        QueueName=f"{prefix}-x", Attributes={"ContentBasedDeduplication": "true"})) == "InvalidAttributeName"
    url = sqs.create_queue(QueueName=f"{prefix}-orders.fifo", Attributes={
        "FifoQueue": "true", "ContentBasedDeduplication": "true"})["QueueUrl"]
    shown = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (shown["FifoQueue"], shown["ContentBasedDeduplication"]) == ("true", "true"), shown
    assert error_code(lambda: sqs.send_message(QueueUrl=url, MessageBody="x")) == "MissingParameter"
    assert error_code(lambda: sqs.send_message(
        QueueUrl=url, MessageBody="x", MessageGroupId="g", DelaySeconds=1)) == "InvalidParameterValue"
    assert sqs.receive_message(QueueUrl=url, ReceiveRequestAttemptId="attempt-1").get("Messages", []) == []
    assert error_code(lambda: sqs.create_queue(QueueName=f"{prefix}-y.fifo", Attributes={
        "FifoQueue": "true", "FifoThroughputLimit": "perMessageGroupId"})) == "InvalidAttributeName"
    check("a FIFO queue: .fifo with FifoQueue, a group on every send, no delay of a message's own")

    sent = {}
    lock = threading.Lock()

    def sender(s):
        mine = client("admin")
        for n in range(25):
            body, group = f"s{s}-{n}", f"g{(s + n) % 5}"
            first = mine.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=group)
            again = mine.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=group)
            assert (again["MessageId"], again["SequenceNumber"]) == \
                (first["MessageId"], first["SequenceNumber"]), (first, again)
            with lock:
                sent[first["MessageId"]] = (group, int(first["SequenceNumber"]))
    threads = [threading.Thread(target=sender, args=(s,)) for s in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(sent) == 100, len(sent)
    shown = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
    assert shown["Attributes"]["ApproximateNumberOfMessages"] == "100", shown
    check("four senders at once, every message sent twice: 100 messages, a repeat has the first's id and number")

    received = receive_all(url, stop_at=50, leave_last_batch=True)
    print(json.dumps({"url": url, "sent": sent, "received": received}))


def receive_all(url, stop_at, leave_last_batch, retries=None):
    """Three receivers at once until `stop_at` receives, checking that no group has two
    out; each message deleted after it is logged, but with `leave_last_batch` the batch that
    reaches `stop_at` is left undeleted (as a receiver killed before its deletes)."""
    received, out, failures = [], {}, []
    lock = threading.Lock()

    def receiver():
        mine = client("admin", retries=retries)
        while True:
            with lock:
                if len(received) >= stop_at or failures:
                    return
            got = mine.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1,
                                       AttributeNames=["All"]).get("Messages", [])
            with lock:
                for message in got:
                    group = message["Attributes"]["MessageGroupId"]
                    if group in out:
                        failures.append(f"two of {group} out: {out[group]} and {message['MessageId']}")
                    out[group] = message["MessageId"]
                    received.append((group, int(message["Attributes"]["SequenceNumber"]),
                                     message["MessageId"]))
                last = leave_last_batch and len(received) >= stop_at
            for message in got:
                # Given back before the delete: the next of the group cannot come before it.
                with lock:
                    del out[message["Attributes"]["MessageGroupId"]]
                if not last:
                    mine.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    threads = [threading.Thread(target=receiver) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    return received


def fifo_after_restart():
    """After a kill -9 of the queue's node (the control plane starts it again): the rest of
    the messages, the undeleted ones first again in their groups; every message received,
    each group in order over both halves; a send again of an early message is still a
    repeat (its deduplication id survived)."""
    state = json.loads(os.environ["QE_FIFO"])
    url, sent = state["url"], state["sent"]
    # The SDK's own retries ride over the node's restart.
    retrying = {"max_attempts": 20, "mode": "standard"}
    sqs = client("admin", retries=retrying)
    # The first message sender 0 sent (group g0), again: its id is still held.
    again = sqs.send_message(QueueUrl=url, MessageBody="s0-0", MessageGroupId="g0")
    assert again["MessageId"] in sent, again
    before = [tuple(r) for r in state["received"]]
    after = drain_fifo(url, sent, before, retrying)
    firsts, seen = {}, set()
    for g, number, message_id in before + after:
        if message_id not in seen:
            seen.add(message_id)
            firsts.setdefault(g, []).append(number)
    assert seen == set(sent), (len(seen), len(sent))
    for g, numbers in firsts.items():
        assert numbers == sorted(numbers), (g, numbers)
    sqs.delete_queue(QueueUrl=url)
    check("after a kill -9 in the middle: every message, each group in order, deduplication kept")


def drain_fifo(url, sent, before, retries):
    """Receives until every sent message has been received (before or now)."""
    have = {r[2] for r in before}
    received = []
    while len(have) < len(sent):
        batch = receive_all(url, stop_at=1, leave_last_batch=False, retries=retries)
        received.extend(batch)
        have.update(r[2] for r in batch)
    return received


def dead_letter_checks():
    """RedrivePolicy naming another queue of the account, RedriveAllowPolicy, and
    ListDeadLetterSourceQueues: set at create (the endpoint) and by SetQueueAttributes at the
    queue's URL (its node, which asks the control plane)."""
    sqs = client("admin")
    prefix = SETUP["prefix"]

    def arn_of(name):
        return f"arn:aws:sqs:{REGION}:000000000000:{name}"

    def redrive(target, count):
        return json.dumps({"deadLetterTargetArn": target, "maxReceiveCount": str(count)})

    def attribute(url, name):
        got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[name])
        return got.get("Attributes", {}).get(name)

    dead = sqs.create_queue(QueueName=f"{prefix}-dead")["QueueUrl"]
    dead_arn = attribute(dead, "QueueArn")
    allow = json.dumps({"redrivePermission": "byQueue",
                        "sourceQueueArns": [arn_of(f"{prefix}-orders")]})
    sqs.set_queue_attributes(QueueUrl=dead, Attributes={"RedriveAllowPolicy": allow})
    assert attribute(dead, "RedriveAllowPolicy") == allow
    check("RedriveAllowPolicy is set at the queue's URL and read back")

    # A queue the policy does not name may not send its dead letters there, and is not made.
    refused = error_code(lambda: sqs.create_queue(
        QueueName=f"{prefix}-other", Attributes={"RedrivePolicy": redrive(dead_arn, 1)}))
    assert refused == "InvalidParameterValue", refused
    missing = error_code(lambda: sqs.get_queue_url(QueueName=f"{prefix}-other"))
    assert missing == "AWS.SimpleQueueService.NonExistentQueue", missing
    check("a create naming a target whose RedriveAllowPolicy leaves it out is refused")

    orders = sqs.create_queue(QueueName=f"{prefix}-orders", Attributes={
        "RedrivePolicy": redrive(dead_arn, 1), "VisibilityTimeout": "0"})["QueueUrl"]
    policy = json.loads(attribute(orders, "RedrivePolicy"))
    assert policy == {"deadLetterTargetArn": dead_arn, "maxReceiveCount": 1}, policy
    sources = sqs.list_dead_letter_source_queues(QueueUrl=dead)["queueUrls"]
    assert sources == [orders], sources
    check("a queue made with another as its dead letter target shows it, and the target lists it")

    attributes = {"kind": {"DataType": "String", "StringValue": "refund"}}
    bodies = [f"poison {n}" for n in range(3)]
    for body in bodies:
        sqs.send_message(QueueUrl=orders, MessageBody=body, MessageAttributes=attributes)
    # Each received once and never deleted: its visibility (0 s) ends, its one allowed
    # receive is spent, and it is dead-lettered, then sent on to the target.
    received = set()
    while len(received) < len(bodies):
        got = sqs.receive_message(QueueUrl=orders, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        received.update(m["Body"] for m in got.get("Messages", []))
    arrived = []
    deadline = time.time() + 60
    while len(arrived) < len(bodies) and time.time() < deadline:
        got = sqs.receive_message(QueueUrl=dead, MaxNumberOfMessages=10, WaitTimeSeconds=5,
                                  MessageAttributeNames=["All"])
        for message in got.get("Messages", []):
            assert message["MessageAttributes"] == attributes, message
            arrived.append(message["Body"])
            sqs.delete_message(QueueUrl=dead, ReceiptHandle=message["ReceiptHandle"])
    assert sorted(arrived) == bodies, arrived
    again = sqs.receive_message(QueueUrl=dead, WaitTimeSeconds=2).get("Messages", [])
    assert again == [], again
    left = sqs.receive_message(QueueUrl=orders, WaitTimeSeconds=1).get("Messages", [])
    assert left == [], left
    check("dead letters arrive at the target once each, with their attributes", f"{len(arrived)}")

    # SetQueueAttributes at a queue's URL names the target by its name's ARN, once the
    # target's policy names it; then back to its own dead letter queue.
    second = sqs.create_queue(QueueName=f"{prefix}-second")["QueueUrl"]
    refused = error_code(lambda: sqs.set_queue_attributes(QueueUrl=second, Attributes={
        "RedrivePolicy": redrive(arn_of(f"{prefix}-dead"), 2)}))
    assert refused == "InvalidParameterValue", refused
    both = json.dumps({"redrivePermission": "byQueue", "sourceQueueArns": [
        arn_of(f"{prefix}-orders"), arn_of(f"{prefix}-second")]})
    sqs.set_queue_attributes(QueueUrl=dead, Attributes={"RedriveAllowPolicy": both})
    sqs.set_queue_attributes(QueueUrl=second, Attributes={
        "RedrivePolicy": redrive(arn_of(f"{prefix}-dead"), 2)})
    policy = json.loads(attribute(second, "RedrivePolicy"))
    assert policy == {"deadLetterTargetArn": dead_arn, "maxReceiveCount": 2}, policy
    sources = sqs.list_dead_letter_source_queues(QueueUrl=dead)["queueUrls"]
    assert sorted(sources) == sorted([orders, second]), sources
    own = attribute(second, "QueueArn") + "-dlq"
    sqs.set_queue_attributes(QueueUrl=second, Attributes={"RedrivePolicy": redrive(own, 2)})
    assert json.loads(attribute(second, "RedrivePolicy"))["deadLetterTargetArn"] == own
    assert sqs.list_dead_letter_source_queues(QueueUrl=dead)["queueUrls"] == [orders]
    check("SetQueueAttributes names a target when its policy allows, and goes back to its own")

    # A FIFO queue's dead letters go to a FIFO queue only, whatever the target allows.
    sqs.set_queue_attributes(QueueUrl=dead, Attributes={
        "RedriveAllowPolicy": json.dumps({"redrivePermission": "allowAll"})})
    refused = error_code(lambda: sqs.create_queue(QueueName=f"{prefix}-first.fifo", Attributes={
        "FifoQueue": "true", "RedrivePolicy": redrive(dead_arn, 1)}))
    assert refused == "InvalidParameterValue", refused

    # A source deleted is no longer listed.
    sqs.delete_queue(QueueUrl=orders)
    assert sqs.list_dead_letter_source_queues(QueueUrl=dead)["queueUrls"] == []
    check("a FIFO source needs a FIFO target; a deleted source is no longer listed")
    for url in (second, dead):
        sqs.delete_queue(QueueUrl=url)


if __name__ == "__main__":
    phase = sys.argv[1]
    {"boto3": boto3_checks, "cli": cli_checks, "query": query_checks, "fifo": fifo_checks,
     "fifo-after-restart": fifo_after_restart, "dead-letters": dead_letter_checks}[phase]()
