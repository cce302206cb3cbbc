import { afterAll, beforeAll, expect, it } from '@jest/globals';
import type pg from 'pg';
import { createEffectLedgerStatements } from '../src/ledger/effect-ledger.sql.js';
import { JetStreamServer } from '../src/rpc/jetstream/index.js';
import { describeWithBroker, JetStreamFixture, NATS_URL, waitFor } from './support/brokers.js';
import { startConsumer, type ConsumerApp } from './support/consumer-app.js';
import { createTables, freshSchema, sqlClient } from './support/database.js';
import { sleep } from './support/http.js';

const CONSUMER = 'refunds-worker';

/**
 * `@Idempotent()` event handlers on a real NATS JetStream (127.0.0.1:4222)
 * through `JetStreamServer`: explicit acks, the key from `Nats-Msg-Id`,
 * redeliveries by nak with a delay, dead letters republished to a stream.
 */
describeWithBroker('nats', 'idempotent message handlers on NATS JetStream', () => {
  let db: pg.Client;
  let js: JetStreamFixture;
  let consumer: ConsumerApp;
  let n = 0;
  const fresh = () => `js-${Date.now()}-${++n}`;
  const effects = async (label: string) =>
    Number((await db.query('SELECT count(*) FROM effects WHERE label = $1', [label])).rows[0].count);
  const keyRow = async (key: string) =>
    (await db.query('SELECT status, attempt FROM idempotency_keys WHERE key = $1', [key])).rows[0] as
      { status: string; attempt: number } | undefined;

  beforeAll(async () => {
    const schema = await freshSchema('messages_jetstream');
    await createTables(schema);
    db = await sqlClient(schema);
    for (const statement of createEffectLedgerStatements('effect_ledger')) await db.query(statement);
    js = await JetStreamFixture.create('refund');
    const strategy = new JetStreamServer({
      servers: NATS_URL,
      stream: { name: js.stream },
      consumer: { name: CONSUMER, config: { ack_wait: 5_000_000_000 } },
      deadLetterSubject: (subject) => `dead-letter.${subject}`,
      // This test's stream has subjects of its own (`<prefix>.refund.requested`); the handlers listen on `refund.requested`.
      pattern: (subject) => subject.slice(js.subject.length + 1),
    });
    consumer = await startConsumer(schema, { strategy });
  });
  afterAll(async () => {
    await consumer?.close();
    await js?.delete();
    await db?.end();
  });

  const subject = (pattern: string) => `${js.subject}.${pattern}`;

  it('runs a message once and acknowledges it after the commit; JetStream keeps no pending ack', async () => {
    const label = fresh();
    await js.publish(subject('refund.requested'), { label }, `msg-${label}`);
    expect(await waitFor(async () => (await keyRow(`msg-${label}`))?.status === 'completed')).toBe(true);
    expect(await js.waitUntilSettled(CONSUMER)).toBe(true);
    expect(await effects(label)).toBe(1);
    expect(consumer.probe.count(label)).toBe(1);
  });

  it('redelivers a failed message (a nak with the lease as delay) and commits its effect once', async () => {
    const label = fresh();
    await js.publish(subject('refund.requested'), { label, failTimes: 1 }, `msg-${label}`);
    expect(await waitFor(async () => (await keyRow(`msg-${label}`))?.status === 'completed')).toBe(true);
    expect(await js.waitUntilSettled(CONSUMER)).toBe(true);
    expect(consumer.probe.count(label)).toBe(2);
    expect(await effects(label)).toBe(1);
    expect(await keyRow(`msg-${label}`)).toEqual({ status: 'completed', attempt: 2 });
  });

  it("acknowledges a duplicate (the same key past JetStream's own publish deduplication) without running it", async () => {
    const label = fresh();
    await js.publish(subject('refund.keyed'), { label, refundId: `rf-${label}` }, `a-${label}`);
    expect(await waitFor(async () => (await keyRow(`rf-${label}`))?.status === 'completed')).toBe(true);
    // After the first completed (one arriving meanwhile would wait out the handler's 30 s lease before its redelivery).
    await js.publish(subject('refund.keyed'), { label, refundId: `rf-${label}` }, `b-${label}`);
    expect(await js.waitUntilSettled(CONSUMER)).toBe(true);
    await sleep(200);
    expect(consumer.probe.count(label)).toBe(1);
    expect(await effects(label)).toBe(1);
  });

  it('dead-letters a poison message to the dead-letter stream after maxDeliveries, and stops delivering it', async () => {
    const label = fresh();
    const before = await js.deadLetterCount();
    await js.publish(subject('refund.requested'), { label, failTimes: 1_000 }, `msg-${label}`);
    expect(await waitFor(async () => (await js.deadLetterCount()) === before + 1, 30_000)).toBe(true);
    expect(await js.waitUntilSettled(CONSUMER)).toBe(true);
    expect(consumer.probe.count(label)).toBe(3);
    await sleep(1_500);
    expect(consumer.probe.count(label)).toBe(3);
    expect(await effects(label)).toBe(0);
  });
});
