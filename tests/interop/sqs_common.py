"""What the SQS scripts (sqs_boto3.py, sqs_query.py, sqs_account.py) share: an error's code,
the AWS CLI as they run it, and the digests AWS documents, computed here to check the node's. Standard library and botocore only: the
query protocol's script runs in a venv of an old boto3 without the other test packages."""

import hashlib
import json
import os
import struct
import subprocess
import sys

from botocore.exceptions import ClientError


def aws_cli(endpoint, key, region):
    """`aws sqs ARGS` (the AWS CLI beside this Python) against `endpoint`, signing with `key`
    ([id, secret]): a function of the arguments, giving the JSON output ({} for none)."""
    env = dict(os.environ, AWS_ACCESS_KEY_ID=key[0], AWS_SECRET_ACCESS_KEY=key[1],
               AWS_DEFAULT_REGION=region, AWS_PAGER="")
    aws = os.path.join(os.path.dirname(sys.executable), "aws")

    def cli(*arguments):
        output = subprocess.run([aws, "sqs", *arguments, "--endpoint-url", endpoint, "--output", "json"],
                                env=env, capture_output=True, text=True, timeout=90)
        assert output.returncode == 0, output.stderr
        return json.loads(output.stdout) if output.stdout.strip() else {}
    return cli


def error_code(call):
    """The code of the error `call` raises (it must raise one)."""
    try:
        call()
    except ClientError as error:
        return error.response["Error"]["Code"]
    raise AssertionError("the call succeeded")


def md5(data):
    return hashlib.md5(data).hexdigest()


def attributes_md5(attributes):
    """MD5OfMessageAttributes, computed here the way AWS documents it."""
    def part(data):
        return struct.pack(">I", len(data)) + data
    out = b""
    for name in sorted(attributes):
        attribute = attributes[name]
        out += part(name.encode()) + part(attribute["DataType"].encode())
        if "StringValue" in attribute:
            out += b"\x01" + part(attribute["StringValue"].encode())
        else:
            out += b"\x02" + part(attribute["BinaryValue"])
    return md5(out)


def send_partial_batch(publisher, url):
    """A batch of three whose middle entry fails (DelaySeconds past 900): the other two are
    sent, with AWS's digests, and the failure says why; a batch with an id twice is refused."""
    result = publisher.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "a", "MessageBody": "first",
         "MessageAttributes": {"n": {"DataType": "Number", "StringValue": "1"}}},
        {"Id": "b", "MessageBody": "too late", "DelaySeconds": 901},
        {"Id": "c", "MessageBody": "third"},
    ])
    assert sorted(s["Id"] for s in result["Successful"]) == ["a", "c"], result
    a = next(s for s in result["Successful"] if s["Id"] == "a")
    assert a["MD5OfMessageBody"] == md5(b"first")
    assert a["MD5OfMessageAttributes"] == attributes_md5({"n": {"DataType": "Number", "StringValue": "1"}})
    assert result["Failed"] == [{"Id": "b", "SenderFault": True, "Code": "InvalidParameterValue",
                                 "Message": result["Failed"][0]["Message"]}], result
    assert error_code(lambda: publisher.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "same", "MessageBody": "x"}, {"Id": "same", "MessageBody": "y"}])) == \
        "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"
