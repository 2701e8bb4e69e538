"""The SQS face with an SDK from before AWS moved SQS to its JSON protocol: boto3 1.26
(botocore 1.29), which speaks the query protocol (forms in, XML out). Run with the interpreter
of the venv scripts/test makes for it (.venv-sqs-query), against the node tests/tests/sqs.rs
started; the setup comes as JSON in QE_SQS, as for sqs_boto3.py. Each check prints one `ok`
line; any failure raises.
"""

import json
import os

import boto3
import botocore
import botocore.config

from sqs_common import attributes_md5, error_code, md5, send_partial_batch

SETUP = json.loads(os.environ["QE_SQS"])


def client(role, secret=None):
    key = SETUP["keys"][role]
    return boto3.client("sqs", endpoint_url=SETUP["endpoint"], region_name="eu-west-1",
                        aws_access_key_id=key[0], aws_secret_access_key=secret or key[1],
                        config=botocore.config.Config(retries={"max_attempts": 0}))


ADMIN, PUBLISHER, SUBSCRIBER = client("admin"), client("publisher"), client("subscriber")


def check(name):
    print(f"ok {name}", flush=True)


def receive(**arguments):
    arguments.setdefault("MaxNumberOfMessages", 10)
    return SUBSCRIBER.receive_message(QueueUrl=URL, **arguments).get("Messages", [])


assert ADMIN.meta.service_model.protocol == "query", ADMIN.meta.service_model.protocol
print(f"botocore {botocore.__version__}, protocol {ADMIN.meta.service_model.protocol}", flush=True)

URL = ADMIN.get_queue_url(QueueName="queue")["QueueUrl"]
assert URL.endswith("/queue"), URL
assert ADMIN.list_queues()["QueueUrls"] == [URL]
try:
    ADMIN.get_queue_url(QueueName="other")
    raise AssertionError("another queue was found")
except ADMIN.exceptions.QueueDoesNotExist:
    pass
check("GetQueueUrl, ListQueues; another queue is QueueDoesNotExist")

attributes = {
    "trace": {"DataType": "String", "StringValue": "abc-123"},
    "count": {"DataType": "Number", "StringValue": "42"},
    "blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xfe\xff"},
    "kind": {"DataType": "String.custom", "StringValue": "é ünïcode <&>"},
}
body = "Hello in XML: <tags> & \"quotes\", ünïcode, a\r\nnewline"
sent = PUBLISHER.send_message(QueueUrl=URL, MessageBody=body, MessageAttributes=attributes)
assert sent["MD5OfMessageBody"] == md5(body.encode()), sent
assert sent["MD5OfMessageAttributes"] == attributes_md5(attributes), sent
[message] = receive(AttributeNames=["All"], MessageAttributeNames=["All"], VisibilityTimeout=60)
assert message["MessageId"] == sent["MessageId"]
assert message["Body"] == body, repr(message["Body"])
assert message["MD5OfBody"] == md5(body.encode())
assert message["MessageAttributes"] == attributes, message["MessageAttributes"]
assert message["MD5OfMessageAttributes"] == attributes_md5(attributes)
assert message["Attributes"]["ApproximateReceiveCount"] == "1", message
assert receive() == [], "invisible while received"
check("SendMessage/ReceiveMessage: the body and attributes round-trip through XML, MD5s as here")

SUBSCRIBER.change_message_visibility(QueueUrl=URL, ReceiptHandle=message["ReceiptHandle"],
                                     VisibilityTimeout=0)
[again] = receive(AttributeNames=["ApproximateReceiveCount"], WaitTimeSeconds=5)
assert again["Attributes"]["ApproximateReceiveCount"] == "2", again
assert error_code(lambda: SUBSCRIBER.change_message_visibility(
    QueueUrl=URL, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=5)) == \
    "AWS.SimpleQueueService.MessageNotInflight"
SUBSCRIBER.delete_message(QueueUrl=URL, ReceiptHandle=again["ReceiptHandle"])
assert error_code(lambda: SUBSCRIBER.delete_message(QueueUrl=URL, ReceiptHandle="nonsense")) == \
    "ReceiptHandleIsInvalid"
check("ChangeMessageVisibility, DeleteMessage, and their refusals")

send_partial_batch(PUBLISHER, URL)
got = receive(WaitTimeSeconds=5)
assert sorted(m["Body"] for m in got) == ["first", "third"], got
deleted = SUBSCRIBER.delete_message_batch(QueueUrl=URL, Entries=[
    {"Id": f"d{n}", "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(got)
] + [{"Id": "bad", "ReceiptHandle": "nonsense"}])
assert len(deleted["Successful"]) == 2, deleted
assert (deleted["Failed"][0]["Id"], deleted["Failed"][0]["Code"]) == ("bad", "ReceiptHandleIsInvalid")
check("SendMessageBatch and DeleteMessageBatch, entry by entry")

ADMIN.set_queue_attributes(QueueUrl=URL, Attributes={"VisibilityTimeout": "40"})
shown = ADMIN.get_queue_attributes(QueueUrl=URL, AttributeNames=["All"])["Attributes"]
assert shown["VisibilityTimeout"] == "40" and shown["ApproximateNumberOfMessages"] == "0", shown
assert error_code(lambda: ADMIN.set_queue_attributes(
    QueueUrl=URL, Attributes={"VisibilityTimeout": "43201"})) == "InvalidAttributeValue"
PUBLISHER.send_message(QueueUrl=URL, MessageBody="to purge")
ADMIN.purge_queue(QueueUrl=URL)
assert receive() == []
check("Get/SetQueueAttributes, PurgeQueue")

# What XML could not carry is refused on the way in, in the body as in an attribute.
assert error_code(lambda: PUBLISHER.send_message(QueueUrl=URL, MessageBody="a\x01b")) == \
    "InvalidMessageContents"
assert error_code(lambda: PUBLISHER.send_message(QueueUrl=URL, MessageBody="x", MessageAttributes={
    "bad": {"DataType": "String", "StringValue": "a\x01b"}})) == "InvalidParameterValue"
assert error_code(lambda: client("admin", secret="wrong").list_queues()) == "SignatureDoesNotMatch"
assert error_code(lambda: PUBLISHER.receive_message(QueueUrl=URL)) == "AccessDenied"
check("control characters, a wrong signature and a publisher's receive are refused, in XML")
