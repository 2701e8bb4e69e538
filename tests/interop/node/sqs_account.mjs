// The control plane's SQS endpoint with the AWS SDK for JavaScript v3 (@aws-sdk/client-sqs),
// as an application written for SQS uses it: only the endpoint and the credentials changed.
// tests/tests/sqs_account.rs starts the control plane (local provider) and makes the account's
// keys; the setup comes as JSON in QE_SQS: {"endpoint", "keys": {role: [id, secret]},
// "prefix"}. Each check prints one `ok` line; any failure throws, and node exits non-zero.
//
// Where the SDK sends a queue action depends on how it was given the endpoint. Given in code
// (`endpoint`), everything goes there, whatever `useQueueUrlAsEndpoint` says. Given outside
// the code (AWS_ENDPOINT_URL_SQS, or `endpoint_url` in the profile), actions that take a
// QueueUrl go to the host of that URL (`useQueueUrlAsEndpoint`, true by default): the node.
import assert from "node:assert/strict";
import {
  SQSClient,
  CreateQueueCommand,
  DeleteMessageBatchCommand,
  DeleteMessageCommand,
  DeleteQueueCommand,
  GetQueueAttributesCommand,
  GetQueueUrlCommand,
  ListQueueTagsCommand,
  ListQueuesCommand,
  ReceiveMessageCommand,
  SendMessageBatchCommand,
  SendMessageCommand,
  TagQueueCommand,
  UntagQueueCommand,
  paginateListQueues,
} from "@aws-sdk/client-sqs";

const SETUP = JSON.parse(process.env.QE_SQS);
const ENDPOINT = SETUP.endpoint;
const REGION = "local";
const PREFIX = SETUP.prefix;

function check(name, detail = "") {
  console.log(`ok ${name}${detail ? `: ${detail}` : ""}`);
}

// The host:port each request of a client went to, by command, and the SDK's warnings.
function client(role, { secret, ...options } = {}) {
  const [accessKeyId, secretAccessKey] = SETUP.keys[role];
  const warnings = [];
  const sqs = new SQSClient({
    region: REGION,
    credentials: { accessKeyId, secretAccessKey: secret ?? secretAccessKey },
    maxAttempts: 1,
    logger: {
      debug() {},
      info() {},
      warn: (message) => warnings.push(String(message)),
      error() {},
    },
    ...options,
  });
  const sent = [];
  sqs.middlewareStack.add(
    (next, context) => async (args) => {
      const { hostname, port } = args.request;
      sent.push({ command: context.commandName, at: `${hostname}:${port}` });
      return next(args);
    },
    { step: "finalizeRequest", name: "whereItWent" },
  );
  return Object.assign(sqs, { sent, warnings });
}

function hostOf(url) {
  const parsed = new URL(url);
  return `${parsed.hostname}:${parsed.port}`;
}

// Where each command of `commands` went, since `from` requests ago.
function placesOf(sqs, commands, from = 0) {
  const places = new Set(
    sqs.sent.slice(from).filter((s) => commands.includes(s.command)).map((s) => s.at),
  );
  return [...places];
}

// The error a call failed with: its class name and its query-compatible code.
async function failure(call) {
  try {
    await call();
  } catch (error) {
    if (error instanceof assert.AssertionError) throw error;
    return { name: error.name, code: error.Code, status: error.$metadata?.httpStatusCode };
  }
  assert.fail("the call succeeded");
}

async function counts(sqs, url) {
  const { Attributes } = await sqs.send(
    new GetQueueAttributesCommand({
      QueueUrl: url,
      AttributeNames: ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    }),
  );
  return [
    Attributes.ApproximateNumberOfMessages,
    Attributes.ApproximateNumberOfMessagesNotVisible,
  ];
}

// Ten messages sent by `publisher` (four alone, six in a batch), then received and deleted by
// `consumer` (one alone, the rest in batches): each arrives once, and none is left.
async function roundTrip(publisher, consumer, url, label) {
  const bodies = Array.from({ length: 10 }, (_, n) => `${label} ${n}`);
  const ids = new Set();
  for (const body of bodies.slice(0, 4)) {
    const sent = await publisher.send(new SendMessageCommand({ QueueUrl: url, MessageBody: body }));
    ids.add(sent.MessageId);
  }
  const batch = await publisher.send(
    new SendMessageBatchCommand({
      QueueUrl: url,
      Entries: bodies.slice(4).map((body, n) => ({ Id: `m${n}`, MessageBody: body })),
    }),
  );
  assert.equal(batch.Successful.length, 6, JSON.stringify(batch));
  assert.equal(batch.Failed?.length ?? 0, 0, JSON.stringify(batch));
  batch.Successful.forEach((entry) => ids.add(entry.MessageId));
  assert.equal(ids.size, 10, "ten message ids");

  const received = new Map();
  const deadline = Date.now() + 20_000;
  let alone = true;
  while (received.size < 10 && Date.now() < deadline) {
    const { Messages = [] } = await consumer.send(
      new ReceiveMessageCommand({ QueueUrl: url, MaxNumberOfMessages: 10, WaitTimeSeconds: 1 }),
    );
    for (const message of Messages) {
      assert.ok(!received.has(message.MessageId), `received twice: ${message.MessageId}`);
      received.set(message.MessageId, message.Body);
    }
    if (alone && Messages.length > 0) {
      const [first, ...rest] = Messages;
      await consumer.send(
        new DeleteMessageCommand({ QueueUrl: url, ReceiptHandle: first.ReceiptHandle }),
      );
      Messages.splice(0, Messages.length, ...rest);
      alone = false;
    }
    if (Messages.length > 0) {
      const deleted = await consumer.send(
        new DeleteMessageBatchCommand({
          QueueUrl: url,
          Entries: Messages.map((m, n) => ({ Id: `d${n}`, ReceiptHandle: m.ReceiptHandle })),
        }),
      );
      assert.equal(deleted.Successful.length, Messages.length, JSON.stringify(deleted));
      assert.equal(deleted.Failed?.length ?? 0, 0, JSON.stringify(deleted));
    }
  }
  assert.deepEqual([...received.keys()].sort(), [...ids].sort());
  assert.deepEqual([...received.values()].sort(), [...bodies].sort());
  const { Messages = [] } = await consumer.send(
    new ReceiveMessageCommand({ QueueUrl: url, WaitTimeSeconds: 0 }),
  );
  assert.deepEqual(Messages, []);
  assert.deepEqual(await counts(consumer, url), ["0", "0"], "none waiting or in flight");
}

const QUEUE_ACTIONS = [
  "SendMessageCommand",
  "SendMessageBatchCommand",
  "ReceiveMessageCommand",
  "DeleteMessageCommand",
  "DeleteMessageBatchCommand",
  "GetQueueAttributesCommand",
];

// Given in code, with `useQueueUrlAsEndpoint: false`: everything through the control plane.
const sqs = client("admin", { endpoint: ENDPOINT, useQueueUrlAsEndpoint: false });
const publisher = client("publisher", { endpoint: ENDPOINT, useQueueUrlAsEndpoint: false });

const orders = `${PREFIX}-orders`;
const attributes = {
  VisibilityTimeout: "45",
  MessageRetentionPeriod: "86400",
  ReceiveMessageWaitTimeSeconds: "1",
};
const made = await sqs.send(
  new CreateQueueCommand({ QueueName: orders, Attributes: attributes, tags: { team: "payments" } }),
);
const url = made.QueueUrl;
assert.equal(made.$metadata.httpStatusCode, 200);
assert.equal(made.$metadata.requestId?.length, 36, JSON.stringify(made.$metadata));
const node = hostOf(url);
assert.notEqual(node, hostOf(ENDPOINT), "the queue's URL names its node");
assert.match(url, /^http:\/\/[^/]+\/[^/]+$/, url);
const queueId = url.split("/").pop();
check("CreateQueue with attributes and tags answers the queue's URL on its node", url);

const again = await sqs.send(new CreateQueueCommand({ QueueName: orders, Attributes: attributes }));
assert.equal(again.QueueUrl, url);
const exists = await failure(() =>
  sqs.send(
    new CreateQueueCommand({
      QueueName: orders,
      Attributes: { ...attributes, VisibilityTimeout: "46" },
    }),
  ),
);
assert.deepEqual(exists, { name: "QueueNameExists", code: "QueueAlreadyExists", status: 400 });
check(
  "CreateQueue is idempotent by name; other attributes are QueueAlreadyExists",
  `error.name ${exists.name}, error.Code ${exists.code}`,
);

const refused = await failure(() => publisher.send(new CreateQueueCommand({ QueueName: `${PREFIX}-x` })));
assert.equal(refused.code, "AccessDenied", JSON.stringify(refused));
const invalid = await failure(() => sqs.send(new CreateQueueCommand({ QueueName: "has space" })));
assert.equal(invalid.code, "InvalidParameterValue", JSON.stringify(invalid));
check("a publisher key may not create, a bad name is refused", `${refused.name}, ${invalid.name}`);

const { Attributes: got } = await sqs.send(
  new GetQueueAttributesCommand({ QueueUrl: url, AttributeNames: ["All"] }),
);
assert.equal(got.VisibilityTimeout, "45", JSON.stringify(got));
assert.equal(got.MaximumMessageSize, "262144", JSON.stringify(got));
assert.equal(got.MessageRetentionPeriod, "86400", JSON.stringify(got));
assert.equal(got.DelaySeconds, "0", JSON.stringify(got));
check("GetQueueAttributes: VisibilityTimeout 45, MaximumMessageSize 262144 (256 KiB)");

await roundTrip(publisher, sqs, url, "through the control plane");
for (const each of [sqs, publisher]) {
  assert.deepEqual(placesOf(each, QUEUE_ACTIONS), [hostOf(ENDPOINT)], JSON.stringify(each.sent));
  assert.deepEqual(each.warnings, []);
}
check("useQueueUrlAsEndpoint false: 10 sent, each received and deleted once, all by the control plane");

// Given outside the code, as AWS documents for other endpoints: the SDK's default, queue
// actions at the queue's URL, which is the node's SQS face and takes the account's keys.
// Every action with a QueueUrl goes there: the account's (TagQueue, UntagQueue,
// ListQueueTags, DeleteQueue) the node hands on to the control plane as they were signed.
process.env.AWS_ENDPOINT_URL_SQS = ENDPOINT;
delete process.env.AWS_IGNORE_CONFIGURED_ENDPOINT_URLS;
const byUrl = client("admin");
const publisherByUrl = client("publisher");
assert.equal(
  (await byUrl.send(new GetQueueUrlCommand({ QueueName: orders }))).QueueUrl,
  url,
);
await roundTrip(publisherByUrl, byUrl, url, "straight to the node");
for (const each of [byUrl, publisherByUrl]) {
  assert.deepEqual(placesOf(each, QUEUE_ACTIONS), [node], JSON.stringify(each.sent));
  assert.ok(
    each.warnings.some((w) => w.includes("using QueueUrl host as endpoint")),
    JSON.stringify(each.warnings),
  );
}
assert.deepEqual(placesOf(byUrl, ["GetQueueUrlCommand"]), [hostOf(ENDPOINT)]);
check("useQueueUrlAsEndpoint (default): 10 sent, each received and deleted once, all by the node", node);

const tagsByUrl = async () => (await byUrl.send(new ListQueueTagsCommand({ QueueUrl: url }))).Tags;
await byUrl.send(new TagQueueCommand({ QueueUrl: url, Tags: { via: "node" } }));
assert.deepEqual(await tagsByUrl(), { team: "payments", via: "node" });
await byUrl.send(new UntagQueueCommand({ QueueUrl: url, TagKeys: ["via"] }));
assert.deepEqual(await tagsByUrl(), { team: "payments" });
const throwaway = (
  await sqs.send(new CreateQueueCommand({ QueueName: `${PREFIX}-via-node` }))
).QueueUrl;
await byUrl.send(new DeleteQueueCommand({ QueueUrl: throwaway }));
const thrownAway = await failure(() =>
  sqs.send(new GetQueueUrlCommand({ QueueName: `${PREFIX}-via-node` })),
);
assert.equal(thrownAway.name, "QueueDoesNotExist", JSON.stringify(thrownAway));
const accountActions = ["TagQueueCommand", "UntagQueueCommand", "ListQueueTagsCommand"];
assert.deepEqual(placesOf(byUrl, accountActions), [node]);
assert.deepEqual(placesOf(byUrl, ["DeleteQueueCommand"]).length, 1);
check("the account's actions sent to the queue's URL: the node hands them on", node);

// Given in code with the default left alone: the SDK does not use the queue's URL.
const inCode = client("admin", { endpoint: ENDPOINT });
await inCode.send(new SendMessageCommand({ QueueUrl: url, MessageBody: "in code" }));
const { Messages: [inCodeMessage] } = await inCode.send(
  new ReceiveMessageCommand({ QueueUrl: url, WaitTimeSeconds: 5 }),
);
assert.equal(inCodeMessage.Body, "in code");
await inCode.send(
  new DeleteMessageCommand({ QueueUrl: url, ReceiptHandle: inCodeMessage.ReceiptHandle }),
);
assert.deepEqual(placesOf(inCode, QUEUE_ACTIONS), [hostOf(ENDPOINT)], JSON.stringify(inCode.sent));
check("an endpoint given in code wins over useQueueUrlAsEndpoint: the control plane serves");

assert.equal((await sqs.send(new GetQueueUrlCommand({ QueueName: orders }))).QueueUrl, url);
const unknown = await failure(() =>
  sqs.send(new GetQueueUrlCommand({ QueueName: `${PREFIX}-none` })),
);
assert.deepEqual(unknown, {
  name: "QueueDoesNotExist",
  code: "AWS.SimpleQueueService.NonExistentQueue",
  status: 400,
});
check("GetQueueUrl by name; an unknown name is QueueDoesNotExist", `error.Code ${unknown.code}`);

const urls = { [orders]: url };
for (const name of [`${PREFIX}-orders-eu`, `${PREFIX}-billing`]) {
  urls[name] = (await sqs.send(new CreateQueueCommand({ QueueName: name }))).QueueUrl;
}
const byPrefix = await sqs.send(new ListQueuesCommand({ QueueNamePrefix: `${PREFIX}-orders` }));
assert.deepEqual(byPrefix.QueueUrls, [url, urls[`${PREFIX}-orders-eu`]]);
assert.equal(byPrefix.NextToken, undefined);
const pages = [];
let NextToken;
do {
  const page = await sqs.send(
    new ListQueuesCommand({ QueueNamePrefix: PREFIX, MaxResults: 1, NextToken }),
  );
  pages.push(page.QueueUrls);
  NextToken = page.NextToken;
} while (NextToken);
assert.deepEqual(pages, [[urls[`${PREFIX}-billing`]], [url], [urls[`${PREFIX}-orders-eu`]]]);
const paginated = [];
for await (const page of paginateListQueues(
  { client: sqs, pageSize: 2 },
  { QueueNamePrefix: PREFIX },
)) {
  paginated.push(page.QueueUrls ?? []);
}
assert.deepEqual(paginated, [
  [urls[`${PREFIX}-billing`], url],
  [urls[`${PREFIX}-orders-eu`]],
]);
const none = await sqs.send(new ListQueuesCommand({ QueueNamePrefix: `${PREFIX}-nothing` }));
assert.deepEqual(none.QueueUrls ?? [], []);
check("ListQueues by prefix, in pages of MaxResults 1 with NextToken, by paginateListQueues");

const tags = async () => (await sqs.send(new ListQueueTagsCommand({ QueueUrl: url }))).Tags;
assert.deepEqual(await tags(), { team: "payments" });
await sqs.send(new TagQueueCommand({ QueueUrl: url, Tags: { env: "test", team: "orders" } }));
assert.deepEqual(await tags(), { env: "test", team: "orders" });
await sqs.send(new UntagQueueCommand({ QueueUrl: url, TagKeys: ["env"] }));
assert.deepEqual(await tags(), { team: "orders" });
const notAdmin = await failure(() =>
  publisher.send(new TagQueueCommand({ QueueUrl: url, Tags: { a: "b" } })),
);
assert.equal(notAdmin.code, "AccessDenied", JSON.stringify(notAdmin));
const fromPublisher = await publisher.send(new ListQueueTagsCommand({ QueueUrl: url }));
assert.deepEqual(fromPublisher.Tags, { team: "orders" });
check("TagQueue, UntagQueue, ListQueueTags; a publisher key reads tags but may not change them");

const eu = urls[`${PREFIX}-orders-eu`];
await sqs.send(new DeleteQueueCommand({ QueueUrl: eu }));
const gone = await failure(() =>
  sqs.send(new GetQueueUrlCommand({ QueueName: `${PREFIX}-orders-eu` })),
);
assert.deepEqual(gone, {
  name: "QueueDoesNotExist",
  code: "AWS.SimpleQueueService.NonExistentQueue",
  status: 400,
});
const left = await sqs.send(new ListQueuesCommand({ QueueNamePrefix: `${PREFIX}-orders` }));
assert.deepEqual(left.QueueUrls, [url]);
const sendToGone = await failure(() =>
  sqs.send(new SendMessageCommand({ QueueUrl: eu, MessageBody: "too late" })),
);
assert.equal(sendToGone.name, "QueueDoesNotExist", JSON.stringify(sendToGone));
await sqs.send(new DeleteQueueCommand({ QueueUrl: urls[`${PREFIX}-billing`] }));
check("DeleteQueue: then GetQueueUrl is QueueDoesNotExist, ListQueues leaves it out");

const wrong = client("admin", { endpoint: ENDPOINT, secret: "wrong" });
const badSignature = await failure(() => wrong.send(new ListQueuesCommand({})));
assert.equal(badSignature.code, "SignatureDoesNotMatch", JSON.stringify(badSignature));
check("a wrong secret is SignatureDoesNotMatch", badSignature.name);

console.log(JSON.stringify({ queue_id: queueId, url }));
