"""The SQS face with real AWS clients: boto3 for every action, and the AWS CLI for a round trip,
against the node tests/tests/sqs.rs started. The setup comes as JSON in QE_SQS: the SQS
endpoint, the three roles' access keys, and the node's WebSocket URL and logins (for the checks
that one queue serves both faces). Each check prints one `ok` line; any failure raises.

`python sqs_boto3.py all` runs every check; `inflight` and `after-restart` are the two halves
of the kill -9 test (messages received, the node killed, then visible again with their counts).
"""

import base64
import json
import os
import sys
import threading
import time

import boto3
import botocore.config
from botocore.exceptions import ClientError

from sqs_common import attributes_md5, aws_cli, error_code, md5, send_partial_batch
from websockets.sync.client import connect as websocket

SETUP = json.loads(os.environ["QE_SQS"])
ENDPOINT = SETUP["endpoint"]
REGION = "eu-west-1"


def check(name, detail=""):
    print(f"ok {name}{': ' + detail if detail else ''}", flush=True)


def client(role, secret=None, key_id=None):
    key = SETUP["keys"][role]
    return boto3.client(
        "sqs",
        endpoint_url=ENDPOINT,
        region_name=REGION,
        aws_access_key_id=key_id or key[0],
        aws_secret_access_key=secret or key[1],
        config=botocore.config.Config(retries={"max_attempts": 0}, read_timeout=30),
    )


ADMIN = client("admin")
PUBLISHER = client("publisher")
SUBSCRIBER = client("subscriber")
QUEUE = SETUP.get("queue", "queue")
URL = ADMIN.get_queue_url(QueueName=QUEUE)["QueueUrl"]


def receive(sqs=SUBSCRIBER, **arguments):
    arguments.setdefault("MaxNumberOfMessages", 10)
    return sqs.receive_message(QueueUrl=URL, **arguments).get("Messages", [])


def drain():
    """Receives and deletes whatever is visible now."""
    while True:
        messages = receive(VisibilityTimeout=60)
        if not messages:
            return
        for message in messages:
            SUBSCRIBER.delete_message(QueueUrl=URL, ReceiptHandle=message["ReceiptHandle"])


def ws_login(role, extra=None):
    name, password = SETUP["logins"][role]
    socket = websocket(SETUP["ws"], open_timeout=10)
    request = {"username": name, "password": password, "role": role, "queuetype": "distribute"}
    request.update(extra or {})
    socket.send(json.dumps(request))
    reply = json.loads(socket.recv(timeout=10))
    assert reply["status"] == "Success.", reply
    return socket


def ws_request(socket, request):
    socket.send(json.dumps(request))
    return json.loads(socket.recv(timeout=10))


def the_queue_is_found_and_listed():
    assert URL.endswith(f"/{QUEUE}"), URL
    assert ADMIN.list_queues()["QueueUrls"] == [URL]
    assert "QueueUrls" not in ADMIN.list_queues(QueueNamePrefix="other") or \
        ADMIN.list_queues(QueueNamePrefix="other")["QueueUrls"] == []
    assert error_code(lambda: ADMIN.get_queue_url(QueueName="other")) == \
        "AWS.SimpleQueueService.NonExistentQueue"
    try:
        ADMIN.get_queue_attributes(QueueUrl=URL + "x", AttributeNames=["All"])
        raise AssertionError("another queue's URL worked")
    except ADMIN.exceptions.QueueDoesNotExist:
        pass
    check("GetQueueUrl, ListQueues; another queue is QueueDoesNotExist", URL)


def send_receive_delete_with_attributes_and_digests():
    drain()
    attributes = {
        "trace": {"DataType": "String", "StringValue": "abc-123"},
        "count": {"DataType": "Number", "StringValue": "42"},
        "blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xfe\xff"},
        "kind": {"DataType": "String.custom", "StringValue": "é ünïcode"},
    }
    body = "Hello from boto3 — ünïcode and \"quotes\""
    before_ms = int(time.time() * 1000)
    sent = PUBLISHER.send_message(QueueUrl=URL, MessageBody=body, MessageAttributes=attributes)
    assert sent["MD5OfMessageBody"] == md5(body.encode()), sent
    assert sent["MD5OfMessageAttributes"] == attributes_md5(attributes), sent
    messages = receive(AttributeNames=["All"], MessageAttributeNames=["All"])
    assert len(messages) == 1, messages
    message = messages[0]
    assert message["MessageId"] == sent["MessageId"]
    assert message["Body"] == body
    assert message["MD5OfBody"] == md5(body.encode())
    assert message["MessageAttributes"] == attributes, message["MessageAttributes"]
    assert message["MD5OfMessageAttributes"] == attributes_md5(attributes)
    assert message["Attributes"]["ApproximateReceiveCount"] == "1", message
    sent_ms = int(message["Attributes"]["SentTimestamp"])
    assert before_ms - 1000 <= sent_ms <= int(time.time() * 1000) + 1000, (before_ms, sent_ms)
    first_ms = int(message["Attributes"]["ApproximateFirstReceiveTimestamp"])
    assert sent_ms <= first_ms <= int(time.time() * 1000) + 1000, (sent_ms, first_ms)
    assert message["Attributes"]["SenderId"] == SETUP["keys"]["publisher"][0], message
    # Only the attributes asked for, and their digest.
    PUBLISHER.send_message(QueueUrl=URL, MessageBody="some", MessageAttributes=attributes)
    some = receive(MessageAttributeNames=["trace", "count"])[0]
    chosen = {k: attributes[k] for k in ["trace", "count"]}
    assert some["MessageAttributes"] == chosen and "Attributes" not in some, some
    assert some["MD5OfMessageAttributes"] == attributes_md5(chosen)
    # A handle is signed: one with another receive's number is refused before it acts.
    handle = base64.urlsafe_b64decode(some["ReceiptHandle"] + "==").decode()
    kind, message_id, number, mac = handle.split(":")
    forged = f"{kind}:{message_id}:{int(number) ^ 1}:{mac}"
    forged = base64.urlsafe_b64encode(forged.encode()).decode().rstrip("=")
    assert error_code(lambda: SUBSCRIBER.delete_message(QueueUrl=URL, ReceiptHandle=forged)) \
        == "ReceiptHandleIsInvalid"
    for done in [message, some]:
        SUBSCRIBER.delete_message(QueueUrl=URL, ReceiptHandle=done["ReceiptHandle"])
    assert receive() == []
    assert error_code(lambda: SUBSCRIBER.delete_message(QueueUrl=URL, ReceiptHandle="nonsense")) \
        == "ReceiptHandleIsInvalid"
    check("SendMessage/ReceiveMessage/DeleteMessage: attributes round-trip, MD5s as computed here")


def long_polling_returns_when_a_message_arrives_or_after_its_wait():
    drain()
    started = time.monotonic()
    assert receive(WaitTimeSeconds=1) == []
    waited = time.monotonic() - started
    assert 0.9 <= waited < 5, waited
    got = {}

    def poll():
        got["messages"] = receive(WaitTimeSeconds=15)
        got["at"] = time.monotonic()

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(0.5)  # the receive is waiting by now; the send must wake it
    sent_at = time.monotonic()
    PUBLISHER.send_message(QueueUrl=URL, MessageBody="wake up")
    poller.join(20)
    assert [m["Body"] for m in got["messages"]] == ["wake up"], got
    latency = got["at"] - sent_at
    assert latency < 10, latency  # well before the 15 s wait ended
    SUBSCRIBER.delete_message(QueueUrl=URL, ReceiptHandle=got["messages"][0]["ReceiptHandle"])
    check("long polling: empty after its wait, and woken by a send",
          f"empty wait {waited:.2f} s, woken {latency * 1000:.0f} ms after the send")


def visibility_expires_and_changes():
    drain()
    PUBLISHER.send_message(QueueUrl=URL, MessageBody="visible again")
    first = receive(VisibilityTimeout=1, AttributeNames=["ApproximateReceiveCount"])
    assert len(first) == 1
    assert receive() == [], "invisible while received"
    again = receive(WaitTimeSeconds=5, VisibilityTimeout=30, AttributeNames=["All"])
    assert [m["Body"] for m in again] == ["visible again"], again
    assert again[0]["Attributes"]["ApproximateReceiveCount"] == "2"
    # The first receive's time, not this one's.
    first_ms = int(again[0]["Attributes"]["ApproximateFirstReceiveTimestamp"])
    assert first_ms <= int(time.time() * 1000) - 900, again[0]["Attributes"]
    # The first receive's handle no longer acts on it.
    assert error_code(lambda: SUBSCRIBER.change_message_visibility(
        QueueUrl=URL, ReceiptHandle=first[0]["ReceiptHandle"], VisibilityTimeout=5)) == \
        "AWS.SimpleQueueService.MessageNotInflight"
    SUBSCRIBER.change_message_visibility(
        QueueUrl=URL, ReceiptHandle=again[0]["ReceiptHandle"], VisibilityTimeout=0)
    third = receive(AttributeNames=["All"])
    assert third[0]["Attributes"]["ApproximateReceiveCount"] == "3", third
    batch = SUBSCRIBER.change_message_visibility_batch(QueueUrl=URL, Entries=[
        {"Id": "good", "ReceiptHandle": third[0]["ReceiptHandle"], "VisibilityTimeout": 60},
        {"Id": "stale", "ReceiptHandle": first[0]["ReceiptHandle"], "VisibilityTimeout": 60},
    ])
    assert [s["Id"] for s in batch["Successful"]] == ["good"], batch
    assert batch["Failed"][0]["Id"] == "stale"
    assert batch["Failed"][0]["Code"] == "AWS.SimpleQueueService.MessageNotInflight"
    SUBSCRIBER.delete_message(QueueUrl=URL, ReceiptHandle=third[0]["ReceiptHandle"])
    assert error_code(lambda: receive(VisibilityTimeout=43201)) == "InvalidParameterValue"
    check("visibility: expires, changes (0 = at once), stale handles refused; receive counts")


def delays_hold_a_message_back():
    drain()
    PUBLISHER.send_message(QueueUrl=URL, MessageBody="later", DelaySeconds=1)
    assert receive() == []
    later = receive(WaitTimeSeconds=5)
    assert [m["Body"] for m in later] == ["later"], later
    SUBSCRIBER.delete_message(QueueUrl=URL, ReceiptHandle=later[0]["ReceiptHandle"])
    assert error_code(lambda: PUBLISHER.send_message(
        QueueUrl=URL, MessageBody="x", DelaySeconds=901)) == "InvalidParameterValue"
    check("DelaySeconds: held back, then received; 901 refused")

    # The queue's own: a delay for messages without one, a wait for receives without one.
    ADMIN.set_queue_attributes(QueueUrl=URL, Attributes={"DelaySeconds": "1",
                                                         "ReceiveMessageWaitTimeSeconds": "5"})
    shown = ADMIN.get_queue_attributes(
        QueueUrl=URL, AttributeNames=["DelaySeconds", "ReceiveMessageWaitTimeSeconds"])["Attributes"]
    assert shown == {"DelaySeconds": "1", "ReceiveMessageWaitTimeSeconds": "5"}, shown
    PUBLISHER.send_message(QueueUrl=URL, MessageBody="the queue's delay")
    assert receive(WaitTimeSeconds=0) == []
    # No WaitTimeSeconds: the queue's 5 s long poll, which the message's delay ending wakes
    # (without the queue's wait the receive would come back empty at once).
    later = receive()
    assert [m["Body"] for m in later] == ["the queue's delay"], later
    SUBSCRIBER.delete_message(QueueUrl=URL, ReceiptHandle=later[0]["ReceiptHandle"])
    PUBLISHER.send_message(QueueUrl=URL, MessageBody="its own", DelaySeconds=0)
    now = receive(WaitTimeSeconds=0)
    assert [m["Body"] for m in now] == ["its own"], now
    SUBSCRIBER.delete_message(QueueUrl=URL, ReceiptHandle=now[0]["ReceiptHandle"])
    started = time.monotonic()
    assert receive() == []
    assert time.monotonic() - started >= 4.5, "an empty queue is long-polled for the queue's wait"
    for name, value in [("DelaySeconds", "901"), ("ReceiveMessageWaitTimeSeconds", "21")]:
        assert error_code(lambda: ADMIN.set_queue_attributes(
            QueueUrl=URL, Attributes={name: value})) == "InvalidAttributeValue"
    ADMIN.set_queue_attributes(QueueUrl=URL, Attributes={"DelaySeconds": "0",
                                                         "ReceiveMessageWaitTimeSeconds": "0"})
    check("the queue's DelaySeconds and ReceiveMessageWaitTimeSeconds: defaults a message or receive overrides")


def max_receive_count_moves_the_message_to_the_dead_letter_queue():
    drain()
    # A target that is not an ARN is refused, as on AWS.
    assert error_code(lambda: ADMIN.set_queue_attributes(QueueUrl=URL, Attributes={
        "RedrivePolicy": json.dumps({"maxReceiveCount": 2, "deadLetterTargetArn": "x"})})) \
        == "InvalidAttributeValue"
    own = ADMIN.get_queue_attributes(QueueUrl=URL, AttributeNames=["QueueArn"])
    own = own["Attributes"]["QueueArn"] + "-dlq"
    ADMIN.set_queue_attributes(QueueUrl=URL, Attributes={
        "RedrivePolicy": json.dumps({"maxReceiveCount": 2, "deadLetterTargetArn": own})})
    policy = ADMIN.get_queue_attributes(QueueUrl=URL, AttributeNames=["RedrivePolicy"])
    policy = json.loads(policy["Attributes"]["RedrivePolicy"])
    assert policy == {"maxReceiveCount": 2, "deadLetterTargetArn": own}, policy
    sent = PUBLISHER.send_message(QueueUrl=URL, MessageBody="poison")
    for attempt in [1, 2]:
        got = receive(WaitTimeSeconds=5, VisibilityTimeout=1)
        assert [m["MessageId"] for m in got] == [sent["MessageId"]], (attempt, got)
    # The second visibility timeout passes: the message goes to the dead letter queue, not
    # back (no third receive needed).
    admin = ws_login("admin")
    deadline = time.monotonic() + 10
    while True:
        page = ws_request(admin, {"cmd": "getdlqmsgs", "after": "", "count": 10})
        if sent["MessageId"] in page["csv"]:
            break
        assert time.monotonic() < deadline, page
        time.sleep(0.1)
    shown = ws_request(admin, {"cmd": "getdlqmsg", "id": sent["MessageId"]})
    assert shown["dlqreason"] == "max-receive-count", shown
    assert receive() == []
    ws_request(admin, {"cmd": "deldlqmsg", "id": sent["MessageId"]})
    admin.close()
    ADMIN.set_queue_attributes(QueueUrl=URL, Attributes={
        "RedrivePolicy": json.dumps({"maxReceiveCount": 0})})
    check("max receive count: after the last visibility timeout, into the DLQ with its reason")


def batches_succeed_and_fail_entry_by_entry():
    drain()
    send_partial_batch(PUBLISHER, URL)
    assert error_code(lambda: PUBLISHER.send_message_batch(QueueUrl=URL, Entries=[
        {"Id": f"e{n}", "MessageBody": "x"} for n in range(11)])) == \
        "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"
    assert error_code(lambda: PUBLISHER.send_message_batch(QueueUrl=URL, Entries=[
        {"Id": "no spaces", "MessageBody": "x"}])) == "AWS.SimpleQueueService.InvalidBatchEntryId"
    got = receive()
    assert sorted(m["Body"] for m in got) == ["first", "third"], got
    deleted = SUBSCRIBER.delete_message_batch(QueueUrl=URL, Entries=[
        {"Id": f"d{n}", "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(got)
    ] + [{"Id": "bad", "ReceiptHandle": "nonsense"}])
    assert len(deleted["Successful"]) == 2, deleted
    assert deleted["Failed"][0]["Id"] == "bad"
    assert deleted["Failed"][0]["Code"] == "ReceiptHandleIsInvalid"
    assert receive() == []
    check("SendMessageBatch/DeleteMessageBatch: partial failures by entry; batch faults refused")


def signatures_and_roles_are_checked():
    assert error_code(lambda: client("admin", secret="not the secret").list_queues()) == \
        "SignatureDoesNotMatch"
    assert error_code(lambda: client("admin", key_id="AKIANOBODY").list_queues()) == \
        "InvalidClientTokenId"
    assert error_code(lambda: receive(PUBLISHER)) == "AccessDenied"
    assert error_code(lambda: SUBSCRIBER.send_message(QueueUrl=URL, MessageBody="x")) == \
        "AccessDenied"
    assert error_code(lambda: SUBSCRIBER.purge_queue(QueueUrl=URL)) == "AccessDenied"
    assert error_code(lambda: PUBLISHER.set_queue_attributes(
        QueueUrl=URL, Attributes={"VisibilityTimeout": "5"})) == "AccessDenied"
    check("SigV4: a wrong secret, an unknown key and each role's limits refused")


def attributes_map_to_settings():
    drain()
    ADMIN.set_queue_attributes(QueueUrl=URL, Attributes={"VisibilityTimeout": "45",
                                                         "MaximumMessageSize": "1024"})
    shown = ADMIN.get_queue_attributes(QueueUrl=URL, AttributeNames=["All"])["Attributes"]
    assert shown["VisibilityTimeout"] == "45" and shown["MaximumMessageSize"] == "1024", shown
    assert error_code(lambda: PUBLISHER.send_message(QueueUrl=URL, MessageBody="x" * 2000)) == \
        "InvalidParameterValue"
    assert error_code(lambda: ADMIN.set_queue_attributes(
        QueueUrl=URL, Attributes={"VisibilityTimeout": "43201"})) == "InvalidAttributeValue"
    assert error_code(lambda: ADMIN.set_queue_attributes(
        QueueUrl=URL, Attributes={"FifoQueue": "true"})) == "InvalidAttributeName"
    ADMIN.set_queue_attributes(QueueUrl=URL, Attributes={"VisibilityTimeout": "30",
                                                         "MaximumMessageSize": "65536"})
    admin = ws_login("admin")
    config = ws_request(admin, {"cmd": "getcfg"})["csv"]
    assert "visibility-timeout-secs,w,30\n" in config and "max-ws-msg-len,w,65536\n" in config
    admin.close()
    for n in range(3):
        PUBLISHER.send_message(QueueUrl=URL, MessageBody=f"counted {n}")
    PUBLISHER.send_message(QueueUrl=URL, MessageBody="delayed", DelaySeconds=600)
    receive(MaxNumberOfMessages=1, VisibilityTimeout=600)
    shown = ADMIN.get_queue_attributes(QueueUrl=URL, AttributeNames=["All"])["Attributes"]
    counts = [shown[k] for k in ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
                                 "ApproximateNumberOfMessagesDelayed"]]
    assert counts == ["2", "1", "1"], shown
    purged = ADMIN.purge_queue(QueueUrl=URL)
    # Every reply carries its request id, as AWS's do (SDKs log it, support tickets quote it).
    request_id = purged["ResponseMetadata"]["RequestId"]
    assert request_id and purged["ResponseMetadata"]["HTTPHeaders"]["x-amzn-requestid"] == request_id, purged
    # One purge a minute, as on AWS.
    try:
        ADMIN.purge_queue(QueueUrl=URL)
        raise AssertionError("a second purge within 60 s succeeded")
    except ClientError as error:
        assert error.response["Error"]["Code"] == "AWS.SimpleQueueService.PurgeQueueInProgress", error.response
        assert error.response["ResponseMetadata"]["RequestId"], error.response
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
             "ApproximateNumberOfMessagesDelayed"]
    shown = ADMIN.get_queue_attributes(QueueUrl=URL, AttributeNames=names)
    assert shown["Attributes"] == {name: "0" for name in names}, shown
    check("Get/SetQueueAttributes are the node's settings; counts; PurgeQueue, in flight too, once a minute; request ids")


def one_queue_two_faces():
    drain()
    publisher = ws_login("publisher")
    reply = ws_request(publisher, {"body": "from the WebSocket"})
    assert reply["status"] == "Success.", reply
    got = receive(AttributeNames=["All"])
    assert [(m["Body"], m["MessageId"]) for m in got] == [("from the WebSocket", reply["id"])], got
    assert got[0]["Attributes"]["SenderId"] == SETUP["logins"]["publisher"][0], got
    SUBSCRIBER.delete_message(QueueUrl=URL, ReceiptHandle=got[0]["ReceiptHandle"])
    subscriber = ws_login("subscriber", {"capacity": 1})
    sent = PUBLISHER.send_message(QueueUrl=URL, MessageBody="from SQS", MessageAttributes={
        "k": {"DataType": "String", "StringValue": "v"}})
    frame = json.loads(subscriber.recv(timeout=10))
    assert frame["id"] == sent["MessageId"] and frame["body"] == "from SQS", frame
    assert frame["attributes"] == {"k": {"DataType": "String", "StringValue": "v"}}, frame
    # Held by the WebSocket subscriber: invisible to an SQS receive.
    assert receive() == []
    ack = ws_request(subscriber, {"id": frame["id"], "ack": 1})
    assert ack["status"] == "Success.", ack
    for socket in [publisher, subscriber]:
        socket.close()
    check("one queue, two faces: WebSocket to SQS, SQS to WebSocket, held is invisible")


def the_aws_cli_round_trip():
    drain()
    cli = aws_cli(ENDPOINT, SETUP["keys"]["admin"], REGION)
    sent = cli("send-message", "--queue-url", URL, "--message-body", "from the aws cli")
    assert sent["MD5OfMessageBody"] == md5(b"from the aws cli"), sent
    got = cli("receive-message", "--queue-url", URL, "--wait-time-seconds", "5")
    assert got["Messages"][0]["Body"] == "from the aws cli", got
    cli("delete-message", "--queue-url", URL, "--receipt-handle", got["Messages"][0]["ReceiptHandle"])
    assert cli("receive-message", "--queue-url", URL).get("Messages", []) == []
    check("the AWS CLI: send-message, receive-message, delete-message")


def over_https():
    """The node serves TLS: the SQS face too, with the same certificate (AWS_CA_BUNDLE trusts
    its CA)."""
    assert ENDPOINT.startswith("https://") and URL.startswith("https://"), (ENDPOINT, URL)
    sent = PUBLISHER.send_message(QueueUrl=URL, MessageBody="over https")
    got = receive(WaitTimeSeconds=5)
    assert [(m["Body"], m["MessageId"]) for m in got] == [("over https", sent["MessageId"])], got
    SUBSCRIBER.delete_message(QueueUrl=URL, ReceiptHandle=got[0]["ReceiptHandle"])
    check("over HTTPS with the queue's certificate: send, receive, delete", URL)


def keys_from_the_control_plane():
    """A queue of the control plane, with keys it issued: each role's key works as its role."""
    assert URL.endswith("/" + QUEUE), URL
    sent = PUBLISHER.send_message(QueueUrl=URL, MessageBody="with the control plane's keys")
    got = receive(WaitTimeSeconds=5)
    assert [m["MessageId"] for m in got] == [sent["MessageId"]], got
    SUBSCRIBER.delete_message(QueueUrl=URL, ReceiptHandle=got[0]["ReceiptHandle"])
    assert error_code(lambda: receive(PUBLISHER)) == "AccessDenied"
    check("keys the control plane issued: send, receive, delete, each as its role", URL)


def revoked():
    """After the subscriber's key was revoked: refused as unknown; the others still work."""
    assert error_code(lambda: receive()) == "InvalidClientTokenId"
    PUBLISHER.send_message(QueueUrl=URL, MessageBody="still works")
    check("a revoked key is refused; the others go on")


def inflight():
    """Before a kill -9: three messages, two of them received (invisible, counted once)."""
    drain()
    for body in ["one", "two", "three"]:
        PUBLISHER.send_message(QueueUrl=URL, MessageBody=body)
    got = receive(MaxNumberOfMessages=2, VisibilityTimeout=600)
    assert len(got) == 2, got
    print(json.dumps(sorted(m["Body"] for m in got)), flush=True)
    check("in flight before the kill", ", ".join(m["Body"] for m in got))


def after_restart():
    """After the kill: every message visible at once, receive counts kept."""
    held = json.loads(os.environ["QE_SQS_HELD"])
    got = receive(AttributeNames=["ApproximateReceiveCount"])
    counts = {m["Body"]: m["Attributes"]["ApproximateReceiveCount"] for m in got}
    expected = {body: ("2" if body in held else "1") for body in ["one", "two", "three"]}
    assert counts == expected, (counts, expected)
    check("after kill -9: invisible messages visible again, receive counts kept", json.dumps(counts))


CHECKS = [
    the_queue_is_found_and_listed,
    send_receive_delete_with_attributes_and_digests,
    long_polling_returns_when_a_message_arrives_or_after_its_wait,
    visibility_expires_and_changes,
    delays_hold_a_message_back,
    max_receive_count_moves_the_message_to_the_dead_letter_queue,
    batches_succeed_and_fail_entry_by_entry,
    signatures_and_roles_are_checked,
    attributes_map_to_settings,
    one_queue_two_faces,
    the_aws_cli_round_trip,
]

if __name__ == "__main__":
    phase = sys.argv[1] if len(sys.argv) > 1 else "all"
    if phase == "all":
        for run in CHECKS:
            run()
    elif phase == "inflight":
        inflight()
    elif phase == "https":
        over_https()
    elif phase == "control-plane":
        keys_from_the_control_plane()
    elif phase == "revoked":
        revoked()
    elif phase == "after-restart":
        after_restart()
    else:
        raise SystemExit(f"unknown phase {phase}")
