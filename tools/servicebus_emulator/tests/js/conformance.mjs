// Conformance checks of a Service Bus namespace (the emulator, or Azure) with the official
// JavaScript SDK, @azure/service-bus 7.x. Session-less queues only.
//
//   node conformance.mjs --list
//       prints the SDK's version and the queues the checks need, as JSON:
//       {"sdk": "@azure/service-bus@7.9.5", "checks": [{"check": NAME, "queue": {settings}}, ...]};
//       the queue of a check is named PREFIX + NAME, with those settings (Service Bus's defaults
//       for any setting not given; durations in seconds).
//   node conformance.mjs --connection-string CS --queue-prefix PREFIX [--only NAME,NAME]
//       runs the checks (each on its own queue, which must exist and be empty) and prints one
//       JSON line per check: {"check", "ok", "ms"} plus "error" when it failed. Exits 1 if any
//       check failed, 2 for bad arguments. The first check, "connect", opens a sender and a
//       management link; if it fails the others are not tried (each would time out the same way).
//
// The connection string and prefix may also come from SERVICEBUS_CONNECTION_STRING and
// SERVICEBUS_QUEUE_PREFIX. Against the emulator, use its connection string as printed
// (UseDevelopmentEmulator=true: the SDK then speaks plain AMQP on the given port).

import { ServiceBusClient } from "@azure/service-bus";
import assert from "node:assert/strict";
import { createRequire } from "node:module";

const SDK = "@azure/service-bus@" + createRequire(import.meta.url)("@azure/service-bus/package.json").version;

const CHECK_TIMEOUT_MS = 45_000;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Receive exactly `count` messages (in as many calls as needed) within `timeoutMs`. */
async function receiveExactly(receiver, count, timeoutMs = 15_000) {
  const received = [];
  const deadline = Date.now() + timeoutMs;
  while (received.length < count) {
    const remaining = deadline - Date.now();
    if (remaining <= 0) {
      throw new Error(`received ${received.length} of ${count} messages within ${timeoutMs} ms`);
    }
    const batch = await receiver.receiveMessages(count - received.length, {
      maxWaitTimeInMs: Math.min(remaining, 5_000),
    });
    received.push(...batch);
  }
  return received;
}

/** Nothing more arrives within `waitMs`. */
async function receiveNothing(receiver, waitMs = 1_000) {
  const extra = await receiver.receiveMessages(1, { maxWaitTimeInMs: waitMs });
  assert.deepEqual(
    extra.map((m) => m.body),
    [],
    "expected no message",
  );
}

/** The queue (or dead-letter queue) holds nothing: a fresh receiver peeks nothing. */
async function assertEmpty(client, queue, options = {}) {
  const peeker = client.createReceiver(queue, options);
  try {
    const left = await peeker.peekMessages(10);
    assert.deepEqual(
      left.map((m) => m.body),
      [],
      `${queue}${options.subQueueType ? " (" + options.subQueueType + ")" : ""} should be empty`,
    );
  } finally {
    await peeker.close();
  }
}

function assertRecent(date, what) {
  assert.ok(date instanceof Date, `${what} should be a Date, got ${date}`);
  assert.ok(Math.abs(Date.now() - date.getTime()) < 60_000, `${what} should be about now, got ${date.toISOString()}`);
}

function assertLockToken(message) {
  assert.match(String(message.lockToken), /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i);
  assert.ok(message.lockedUntilUtc > new Date(), "lockedUntilUtc should be in the future");
}

const checks = [
  {
    // Every link starts with a $cbs put-token, and peek is a $management request: both replies
    // must be correlated with the request's (string) message id.
    name: "connect",
    queue: {},
    timeoutMs: 20_000,
    async run({ client, queue, use }) {
      const sender = use(client.createSender(queue));
      const batch = await sender.createMessageBatch(); // opens the link
      assert.equal(batch.count, 0);
      const receiver = use(client.createReceiver(queue));
      assert.deepEqual(await receiver.peekMessages(1), []);
    },
  },
  {
    name: "send-batch",
    queue: {},
    async run({ client, queue, use }) {
      const sender = use(client.createSender(queue));
      const batch = await sender.createMessageBatch();
      assert.ok(batch.maxSizeInBytes > 0, "the batch has a size limit");
      for (let i = 0; i < 5; i++) {
        assert.ok(
          batch.tryAddMessage({ body: `batch-${i}`, messageId: `batch-${i}`, applicationProperties: { index: i } }),
          `message ${i} fits in the batch`,
        );
      }
      assert.equal(batch.count, 5);
      await sender.sendMessages(batch);
      const receiver = use(client.createReceiver(queue));
      const messages = await receiveExactly(receiver, 5);
      assert.deepEqual(
        messages.map((m) => [m.body, m.messageId, m.applicationProperties.index]),
        [0, 1, 2, 3, 4].map((i) => [`batch-${i}`, `batch-${i}`, i]),
      );
      for (let i = 1; i < messages.length; i++) {
        assert.ok(messages[i].sequenceNumber.greaterThan(messages[i - 1].sequenceNumber), "sequence numbers grow");
      }
      for (const message of messages) {
        assertLockToken(message);
        await receiver.completeMessage(message);
      }
      await assertEmpty(client, queue);
    },
  },
  {
    name: "send-properties",
    queue: {},
    async run({ client, queue, use }) {
      const sender = use(client.createSender(queue));
      const sent = {
        body: { order: 42, items: ["a", "b"] },
        messageId: "order-42",
        correlationId: "corr-7",
        subject: "the subject",
        contentType: "application/json",
        replyTo: "replies",
        to: "someone",
        timeToLive: 5 * 60 * 1000,
        applicationProperties: { text: "v", number: 42, ratio: 0.5, flag: true },
      };
      await sender.sendMessages(sent);
      await sender.sendMessages([
        { body: "second", messageId: "m-2" },
        { body: "third", messageId: "m-3" },
      ]);
      const receiver = use(client.createReceiver(queue));
      const [got, second, third] = await receiveExactly(receiver, 3);
      assert.deepEqual(got.body, sent.body);
      for (const key of ["messageId", "correlationId", "subject", "contentType", "replyTo", "to", "timeToLive"]) {
        assert.equal(got[key], sent[key], key);
      }
      assert.deepEqual(got.applicationProperties, sent.applicationProperties);
      assert.equal(got.deliveryCount, 0, "deliveryCount of a first delivery");
      assertRecent(got.enqueuedTimeUtc, "enqueuedTimeUtc");
      assert.equal(got.expiresAtUtc.getTime(), got.enqueuedTimeUtc.getTime() + sent.timeToLive, "expiresAtUtc");
      assert.equal(got.state, "active");
      assertLockToken(got);
      assert.deepEqual([second.body, second.messageId, third.body, third.messageId], ["second", "m-2", "third", "m-3"]);
      assert.ok(second.sequenceNumber.greaterThan(got.sequenceNumber));
      for (const message of [got, second, third]) {
        await receiver.completeMessage(message);
      }
      await assertEmpty(client, queue);
    },
  },
  {
    name: "abandon-until-dead-lettered",
    queue: { max_delivery_count: 3 },
    async run({ client, queue, use }) {
      const sender = use(client.createSender(queue));
      await sender.sendMessages({ body: "unlucky", messageId: "unlucky" });
      const receiver = use(client.createReceiver(queue));
      const counts = [];
      for (let attempt = 0; attempt < 3; attempt++) {
        const [message] = await receiveExactly(receiver, 1);
        assert.equal(message.messageId, "unlucky");
        counts.push(message.deliveryCount);
        await receiver.abandonMessage(message);
      }
      assert.deepEqual(counts, [counts[0], counts[0] + 1, counts[0] + 2], "each abandon counts a delivery");
      await receiveNothing(receiver);
      const deadLetters = use(client.createReceiver(queue, { subQueueType: "deadLetter" }));
      const [dead] = await receiveExactly(deadLetters, 1);
      assert.equal(dead.messageId, "unlucky");
      assert.equal(dead.body, "unlucky");
      assert.equal(dead.deadLetterReason, "MaxDeliveryCountExceeded");
      assert.ok(dead.deadLetterErrorDescription, "a dead-letter error description");
      await deadLetters.completeMessage(dead);
      await assertEmpty(client, queue);
      await assertEmpty(client, queue, { subQueueType: "deadLetter" });
    },
  },
  {
    name: "abandon-properties-to-modify",
    queue: {},
    async run({ client, queue, use }) {
      const sender = use(client.createSender(queue));
      await sender.sendMessages({ body: "retry me", applicationProperties: { kept: "yes", attempt: 0 } });
      const receiver = use(client.createReceiver(queue));
      const [first] = await receiveExactly(receiver, 1);
      await receiver.abandonMessage(first, { attempt: 1, reason: "try later" });
      const [second] = await receiveExactly(receiver, 1);
      assert.equal(second.sequenceNumber.toString(), first.sequenceNumber.toString());
      assert.equal(second.deliveryCount, first.deliveryCount + 1);
      assert.deepEqual(second.applicationProperties, { kept: "yes", attempt: 1, reason: "try later" });
      await receiver.completeMessage(second);
      await assertEmpty(client, queue);
    },
  },
  {
    name: "dead-letter",
    queue: {},
    async run({ client, queue, use }) {
      const sender = use(client.createSender(queue));
      await sender.sendMessages({ body: "poison", applicationProperties: { kept: "yes" } });
      const receiver = use(client.createReceiver(queue));
      const [message] = await receiveExactly(receiver, 1);
      await receiver.deadLetterMessage(message, {
        deadLetterReason: "BadOrder",
        deadLetterErrorDescription: "amount is negative",
        note: "set while dead-lettering",
      });
      await assertEmpty(client, queue);
      const deadLetters = use(client.createReceiver(queue, { subQueueType: "deadLetter" }));
      const [dead] = await receiveExactly(deadLetters, 1);
      assert.equal(dead.body, "poison");
      assert.equal(dead.sequenceNumber.toString(), message.sequenceNumber.toString());
      assert.equal(dead.deadLetterReason, "BadOrder");
      assert.equal(dead.deadLetterErrorDescription, "amount is negative");
      assert.equal(dead.applicationProperties.kept, "yes");
      assert.equal(dead.applicationProperties.note, "set while dead-lettering");
      await deadLetters.completeMessage(dead);
      await assertEmpty(client, queue, { subQueueType: "deadLetter" });
    },
  },
  {
    name: "defer",
    queue: {},
    async run({ client, queue, use }) {
      const sender = use(client.createSender(queue));
      await sender.sendMessages([{ body: "deferred" }, { body: "next" }]);
      const receiver = use(client.createReceiver(queue));
      const [first, second] = await receiveExactly(receiver, 2);
      await receiver.deferMessage(first, { deferredBy: "conformance" });
      await receiver.completeMessage(second);
      await receiveNothing(receiver);
      const [peeked] = await receiver.peekMessages(5);
      assert.equal(peeked?.state, "deferred");
      const [again] = await receiver.receiveDeferredMessages(first.sequenceNumber);
      assert.equal(again.body, "deferred");
      assert.equal(again.applicationProperties.deferredBy, "conformance");
      assertLockToken(again);
      await receiver.completeMessage(again); // settled through $management
      await assertEmpty(client, queue);
    },
  },
  {
    name: "schedule-and-cancel",
    queue: {},
    async run({ client, queue, use }) {
      const sender = use(client.createSender(queue));
      const at = new Date(Date.now() + 1_500);
      const [keep] = await sender.scheduleMessages({ body: "keep", messageId: "keep" }, at);
      const [cancel] = await sender.scheduleMessages({ body: "cancel", messageId: "cancel" }, at);
      assert.ok(cancel.greaterThan(keep), "sequence numbers of scheduled messages grow");
      await sender.cancelScheduledMessages(cancel);
      await sender.sendMessages({ body: "later", scheduledEnqueueTimeUtc: new Date(Date.now() + 1_000) });
      const receiver = use(client.createReceiver(queue));
      const peeked = await receiver.peekMessages(10);
      assert.deepEqual(
        peeked.map((m) => [m.body, m.state]),
        [
          ["keep", "scheduled"],
          ["later", "scheduled"],
        ],
      );
      assert.equal(peeked[0].sequenceNumber.toString(), keep.toString());
      const messages = await receiveExactly(receiver, 2);
      assert.ok(Date.now() >= at.getTime() - 50, "not delivered before its time");
      assert.deepEqual(messages.map((m) => m.body).sort(), ["keep", "later"]);
      for (const message of messages) {
        await receiver.completeMessage(message);
      }
      await receiveNothing(receiver);
      await assertEmpty(client, queue);
    },
  },
  {
    name: "peek",
    queue: {},
    async run({ client, queue, use }) {
      const sender = use(client.createSender(queue));
      await sender.sendMessages([0, 1, 2, 3, 4].map((i) => ({ body: `p${i}` })));
      const receiver = use(client.createReceiver(queue));
      const peeked = await receiver.peekMessages(3);
      assert.deepEqual(
        peeked.map((m) => m.body),
        ["p0", "p1", "p2"],
      );
      assert.ok(peeked.every((m) => m.lockToken === undefined), "peeked messages are not locked");
      const rest = await receiver.peekMessages(10, { fromSequenceNumber: peeked[2].sequenceNumber.add(1) });
      assert.deepEqual(
        rest.map((m) => m.body),
        ["p3", "p4"],
      );
      await assert.rejects(receiver.completeMessage(peeked[0]), "a peeked message cannot be settled");
      const messages = await receiveExactly(receiver, 5);
      assert.deepEqual(
        messages.map((m) => m.sequenceNumber.toString()),
        [...peeked, ...rest].map((m) => m.sequenceNumber.toString()),
      );
      for (const message of messages) {
        await receiver.completeMessage(message);
      }
      await assertEmpty(client, queue);
    },
  },
  {
    name: "renew-lock",
    queue: {},
    async run({ client, queue, use }) {
      const sender = use(client.createSender(queue));
      await sender.sendMessages({ body: "long job" });
      const receiver = use(client.createReceiver(queue, { maxAutoLockRenewalDurationInMs: 0 }));
      const [message] = await receiveExactly(receiver, 1);
      const before = message.lockedUntilUtc;
      await sleep(1_100);
      const renewed = await receiver.renewMessageLock(message);
      assert.ok(renewed instanceof Date, "renewMessageLock returns a Date");
      assert.ok(
        renewed.getTime() >= before.getTime() + 1_000,
        `renewed until ${renewed.toISOString()}, was ${before.toISOString()}`,
      );
      assert.equal(message.lockedUntilUtc.getTime(), renewed.getTime(), "the message's lockedUntilUtc is updated");
      await receiver.completeMessage(message);
      await assertEmpty(client, queue);
    },
  },
  {
    // Queues here are not session-enabled: a session receiver is refused at once (the link's attach
    // is answered with a detach carrying amqp:not-allowed, as Azure answers a session receiver on a
    // queue without sessions), not retried and never turned into a plain receiver. With a client on
    // the SDK's default retry options, each refusal must come well before any timeout.
    name: "session-receivers-refused",
    queue: {},
    async run({ client, queue, use, connectionString }) {
      const sender = use(client.createSender(queue));
      await sender.sendMessages({ body: "in a session", sessionId: "s1" });
      const defaults = use(new ServiceBusClient(connectionString)); // default retries and timeouts
      const refused = async (what, accept) => {
        const started = Date.now();
        const error = await accept().then(
          (receiver) => {
            use(receiver);
            throw new Error(`${what} opened a receiver on a queue without sessions`);
          },
          (err) => err,
        );
        const ms = Date.now() - started;
        assert.ok(ms < 5_000, `${what} was refused after ${ms} ms`);
        assert.equal(error.name, "ServiceBusError", `${what}: ${error.stack ?? error}`);
        assert.equal(error.retryable, false, `${what} is not retryable`);
        return error;
      };
      const next = await refused("acceptNextSession", () => defaults.acceptNextSession(queue));
      // The service's error (Azure's words, which the emulator uses too), as the SDK surfaces amqp:not-allowed.
      assert.match(
        next.message,
        /^InvalidOperationError: A sessionful message receiver cannot be created on an entity that does not require sessions/,
      );
      // acceptSession: the SDK compares the session id of the answering attach (a refused link's has
      // none) before it reads the error of the detach that follows, and reports its own
      // SessionCannotBeLocked, whatever the service's error.
      const named = await refused("acceptSession", () => defaults.acceptSession(queue, "s1"));
      assert.equal(named.code, "SessionCannotBeLocked", named.message);
      assert.match(named.message, /requested session 's1'/);
      const receiver = use(client.createReceiver(queue));
      const [message] = await receiveExactly(receiver, 1);
      assert.deepEqual([message.body, message.sessionId], ["in a session", "s1"]);
      await receiver.completeMessage(message);
      await assertEmpty(client, queue);
    },
  },
  {
    name: "receive-and-delete",
    queue: {},
    async run({ client, queue, use }) {
      const sender = use(client.createSender(queue));
      await sender.sendMessages([{ body: "a" }, { body: "b" }, { body: "c" }]);
      const receiver = use(client.createReceiver(queue, { receiveMode: "receiveAndDelete" }));
      const messages = await receiveExactly(receiver, 3);
      assert.deepEqual(
        messages.map((m) => m.body),
        ["a", "b", "c"],
      );
      assert.ok(messages.every((m) => m.lockToken === undefined), "no lock tokens in receiveAndDelete mode");
      await assertEmpty(client, queue);
    },
  },
];

function parseArgs(argv) {
  const args = {
    list: false,
    connectionString: process.env.SERVICEBUS_CONNECTION_STRING,
    prefix: process.env.SERVICEBUS_QUEUE_PREFIX,
    only: null,
  };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === "--list") args.list = true;
    else if (arg === "--connection-string") args.connectionString = argv[++i];
    else if (arg === "--queue-prefix") args.prefix = argv[++i];
    else if (arg === "--only") args.only = new Set(argv[++i].split(","));
    else throw new Error(`unknown argument ${arg}`);
  }
  if (!args.list && (!args.connectionString || args.prefix === undefined)) {
    throw new Error(
      "give --connection-string and --queue-prefix (or SERVICEBUS_CONNECTION_STRING, SERVICEBUS_QUEUE_PREFIX)",
    );
  }
  return args;
}

async function runCheck(check, connectionString, queue) {
  const timeoutMs = check.timeoutMs ?? CHECK_TIMEOUT_MS;
  const client = new ServiceBusClient(connectionString, {
    retryOptions: { maxRetries: 0, timeoutInMs: 15_000 },
  });
  const opened = [];
  const use = (closable) => {
    opened.push(closable);
    return closable;
  };
  const started = Date.now();
  let timer;
  try {
    await Promise.race([
      check.run({ client, queue, use, connectionString }),
      new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error(`timed out after ${timeoutMs} ms`)), timeoutMs);
      }),
    ]);
    return { check: check.name, ok: true, ms: Date.now() - started };
  } catch (error) {
    return { check: check.name, ok: false, ms: Date.now() - started, error: String(error?.stack ?? error) };
  } finally {
    clearTimeout(timer);
    for (const closable of opened.reverse()) {
      await closable.close().catch(() => {});
    }
    await client.close().catch(() => {});
  }
}

async function main() {
  let args;
  try {
    args = parseArgs(process.argv.slice(2));
  } catch (error) {
    console.error(String(error.message ?? error));
    return 2;
  }
  if (args.list) {
    const list = checks.map((check) => ({ check: check.name, queue: check.queue }));
    console.log(JSON.stringify({ sdk: SDK, checks: list }));
    return 0;
  }
  const selected = checks.filter((check) => !args.only || args.only.has(check.name));
  if (args.only && selected.length !== args.only.size) {
    console.error(`unknown check in --only; known: ${checks.map((c) => c.name).join(", ")}`);
    return 2;
  }
  let failed = 0;
  let connected = true;
  for (const check of selected) {
    const result = connected
      ? await runCheck(check, args.connectionString, args.prefix + check.name)
      : { check: check.name, ok: false, ms: 0, error: "not run: the connect check failed" };
    if (!result.ok) failed++;
    if (check.name === "connect" && !result.ok) connected = false;
    console.log(JSON.stringify(result));
  }
  console.error(`${selected.length - failed} passed, ${failed} failed`);
  return failed ? 1 : 0;
}

process.exit(await main());
