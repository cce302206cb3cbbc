import { afterAll, beforeAll, beforeEach, expect, it } from '@jest/globals';
import type pg from 'pg';
import { fingerprintValue } from '../src/core/fingerprint-value.js';
import { createEffectLedgerStatements } from '../src/ledger/effect-ledger.sql.js';
import { describeWithBroker, RabbitQueue, waitFor } from './support/brokers.js';
import { startConsumer, type ConsumerApp, type TestMessage } from './support/consumer-app.js';
import { createTables, freshSchema, sqlClient } from './support/database.js';
import { sleep } from './support/http.js';

/**
 * `@Idempotent()` message handlers on a real RabbitMQ (127.0.0.1:5672): one
 * consumer process, manual acknowledgements, effects counted in PostgreSQL.
 * The multi-process and crash scenarios are in test/reliability/consumers.spec.ts.
 */
describeWithBroker('rabbitmq', 'idempotent message handlers on RabbitMQ', () => {
  let db: pg.Client;
  let queue: RabbitQueue;
  let consumer: ConsumerApp;
  let n = 0;
  const fresh = () => `rmq-${Date.now()}-${++n}`;
  const effects = async (label: string) =>
    Number((await db.query('SELECT count(*) FROM effects WHERE label = $1', [label])).rows[0].count);
  const keyRow = async (key: string) =>
    (await db.query('SELECT status, attempt FROM idempotency_keys WHERE key = $1', [key])).rows[0] as
      { status: string; attempt: number } | undefined;
  const publish = (data: TestMessage, messageId?: string, pattern = 'refund.requested') =>
    queue.publish(pattern, data, messageId ? { messageId } : {});

  beforeAll(async () => {
    const schema = await freshSchema('messages_rabbitmq');
    await createTables(schema);
    db = await sqlClient(schema);
    for (const statement of createEffectLedgerStatements('effect_ledger')) await db.query(statement);
    queue = await RabbitQueue.create('idem-test');
    consumer = await startConsumer(schema, { rmq: queue.consumerOptions() });
  });
  afterAll(async () => {
    await consumer?.close();
    await queue?.delete();
    await db?.end();
  });
  beforeEach(async () => {
    await queue.takeDeadLetters();
  });

  it('runs a message once, commits its effect with the completion, then acknowledges it', async () => {
    const label = fresh();
    await publish({ label }, `msg-${label}`);
    expect(await waitFor(async () => (await keyRow(`msg-${label}`))?.status === 'completed')).toBe(true);
    expect(await queue.waitUntilDrained()).toBe(true);
    expect(await effects(label)).toBe(1);
    expect(consumer.probe.count(label)).toBe(1);
  });

  it('acknowledges a redelivered completed message without running the handler again', async () => {
    const label = fresh();
    await publish({ label }, `msg-${label}`);
    expect(await waitFor(async () => (await keyRow(`msg-${label}`))?.status === 'completed')).toBe(true);
    for (let i = 0; i < 3; i++) await publish({ label }, `msg-${label}`);
    expect(await queue.waitUntilDrained()).toBe(true);
    await sleep(300);
    expect(consumer.probe.count(label)).toBe(1);
    expect(await effects(label)).toBe(1);
    expect(await queue.depth(queue.deadLetters)).toBe(0);
  });

  it('requeues a duplicate that finds the key in flight after its Retry-After, then acknowledges it as a replay', async () => {
    const label = fresh();
    // The first delivery holds the key for 1.2 s; the duplicate arrives meanwhile and must come back, not be dropped.
    await publish({ label, delayMs: 1_200 }, `msg-${label}`);
    await waitFor(() => consumer.probe.count(label) === 1);
    await publish({ label, delayMs: 1_200 }, `msg-${label}`);
    expect(await waitFor(async () => (await keyRow(`msg-${label}`))?.status === 'completed')).toBe(true);
    expect(await queue.waitUntilDrained()).toBe(true);
    expect(consumer.probe.count(label)).toBe(1);
    expect(await effects(label)).toBe(1);
    expect(await queue.depth(queue.deadLetters)).toBe(0);
  });

  it('rolls a failed delivery back and redelivers it once the lease allows a takeover; the next attempt commits once', async () => {
    const label = fresh();
    await publish({ label, failTimes: 1 }, `msg-${label}`);
    expect(await waitFor(async () => (await keyRow(`msg-${label}`))?.status === 'completed')).toBe(true);
    expect(consumer.probe.count(label)).toBe(2);
    // The failed attempt's insert rolled back with its transaction.
    expect(await effects(label)).toBe(1);
    expect(await keyRow(`msg-${label}`)).toEqual({ status: 'completed', attempt: 2 });
    expect(await queue.waitUntilDrained()).toBe(true);
  });

  it('dead-letters a poison message after maxDeliveries failed deliveries instead of looping', async () => {
    const label = fresh();
    await publish({ label, failTimes: 1_000 }, `msg-${label}`);
    expect(await queue.waitForDeadLetters(1, 30_000)).toBe(true);
    const [dead] = await queue.takeDeadLetters();
    expect(dead.messageId).toBe(`msg-${label}`);
    expect(dead.content.data).toMatchObject({ label });
    // maxDeliveries is 3 on this handler: three attempts, all rolled back, and no fourth.
    expect(consumer.probe.count(label)).toBe(3);
    await sleep(2_000);
    expect(consumer.probe.count(label)).toBe(3);
    expect(await effects(label)).toBe(0);
    expect(await queue.depth()).toBe(0);
  });

  it('dead-letters, before its handler runs, a message whose earlier deliveries all died without a verdict (crashes, OOM)', async () => {
    const label = fresh();
    const data = { label };
    // What three deliveries that each killed their consumer leave behind: the key in flight, attempted 3 times, its lease run out.
    await db.query(
      `INSERT INTO idempotency_keys (tenant_id, key, fingerprint, status, owner_token, generation, attempt, lease_expires_at, expires_at, expiry_floor)
       VALUES ('tenant-a', $1, $2, 'in_flight', gen_random_uuid(), gen_random_uuid(), 3, now() - interval '1 second', now() + interval '1 hour',
               now() + interval '1 hour')`,
      [`msg-${label}`, fingerprintValue({ pattern: 'refund.requested', data })],
    );
    await publish(data, `msg-${label}`);
    expect(await queue.waitForDeadLetters(1, 10_000)).toBe(true);
    const [dead] = await queue.takeDeadLetters();
    expect(dead.messageId).toBe(`msg-${label}`);
    // maxDeliveries is 3 on this handler: no fourth run.
    expect(consumer.probe.count(label)).toBe(0);
    expect(await effects(label)).toBe(0);
    // The key is given back, so a redrive once the cause is fixed starts with a fresh count.
    expect(await keyRow(`msg-${label}`)).toBeUndefined();
    const line = consumer.logs.find((l) => l.includes('already attempted 3 times'));
    expect(line).toContain('RefundsConsumer.requested');
    expect(line).not.toContain(`msg-${label}`);
  });

  it('runs a phased handler: a redelivery after a failure between phases resumes after the recorded phase', async () => {
    const label = fresh();
    await publish({ label, failTimes: 1 }, `msg-${label}`, 'refund.phased');
    expect(await waitFor(async () => (await keyRow(`msg-${label}`))?.status === 'completed')).toBe(true);
    expect(consumer.probe.count(`${label}:record`)).toBe(1);
    expect(consumer.probe.count(`${label}:between`)).toBe(2);
    expect(consumer.probe.count(`${label}:confirm`)).toBe(1);
    // The recorded phase committed on its own and was not repeated by the redelivery.
    expect(await effects(label)).toBe(1);
    expect(await queue.waitUntilDrained()).toBe(true);
  });

  it('dead-letters a message without a key at once, and runs none of it', async () => {
    const label = fresh();
    await publish({ label });
    expect(await queue.waitForDeadLetters(1)).toBe(true);
    expect((await queue.takeDeadLetters())[0].content.data).toMatchObject({ label });
    expect(consumer.probe.count(label)).toBe(0);
  });

  it('runs a message without a key on a handler with required: false, without idempotency', async () => {
    const label = fresh();
    await publish({ label }, undefined, 'refund.optional');
    await publish({ label }, undefined, 'refund.optional');
    expect(await waitFor(async () => (await effects(label)) === 2)).toBe(true);
    expect(await queue.waitUntilDrained()).toBe(true);
  });

  it('reads the key from a payload field when the handler names one', async () => {
    const label = fresh();
    await publish({ label, refundId: `rf-${label}` }, `a-${label}`, 'refund.keyed');
    expect(await waitFor(async () => (await keyRow(`rf-${label}`))?.status === 'completed')).toBe(true);
    // After the first completed (one arriving meanwhile would wait out the handler's 30 s lease before its redelivery).
    await publish({ label, refundId: `rf-${label}` }, `b-${label}`, 'refund.keyed');
    expect(await queue.waitUntilDrained()).toBe(true);
    expect(await effects(label)).toBe(1);
    expect(await keyRow(`a-${label}`)).toBeUndefined();
  });

  it('scopes keys per tenant: the same message id in two tenants is two messages', async () => {
    const label = fresh();
    await publish({ label, tenant: 'tenant-a' }, `msg-${label}`);
    await publish({ label, tenant: 'tenant-b' }, `msg-${label}`);
    expect(await waitFor(async () => (await effects(label)) === 2)).toBe(true);
    const { rows } = await db.query('SELECT tenant FROM effects WHERE label = $1 ORDER BY tenant', [label]);
    expect(rows.map((r) => r.tenant)).toEqual(['tenant-a', 'tenant-b']);
  });

  it('dead-letters a message whose key was used by a different message', async () => {
    const label = fresh();
    await publish({ label }, `msg-${label}`);
    expect(await waitFor(async () => (await keyRow(`msg-${label}`))?.status === 'completed')).toBe(true);
    await publish({ label: `${label}-other` }, `msg-${label}`);
    expect(await queue.waitForDeadLetters(1)).toBe(true);
    expect(consumer.probe.count(`${label}-other`)).toBe(0);
  });

  it('stores a definite refusal (an RpcException): the message is acknowledged and its redelivery not run again', async () => {
    const label = fresh();
    await publish({ label, refuse: true }, `msg-${label}`);
    expect(await waitFor(async () => (await keyRow(`msg-${label}`))?.status === 'completed')).toBe(true);
    await publish({ label, refuse: true }, `msg-${label}`);
    expect(await queue.waitUntilDrained()).toBe(true);
    await sleep(300);
    expect(consumer.probe.count(label)).toBe(1);
    // The refusal's writes rolled back, as for a 4xx on an HTTP route.
    expect(await effects(label)).toBe(0);
    expect(await queue.depth(queue.deadLetters)).toBe(0);
  });

  it('answers a MessagePattern once, and a redelivery with the stored reply', async () => {
    const label = fresh();
    const first = await queue.request('refund.quote', { label }, `q-${label}`);
    const second = await queue.request('refund.quote', { label }, `q-${label}`);
    expect(first).toEqual([{ response: { label, invocation: 1, quotedAt: '2026-01-01T00:00:00.000Z' } }]);
    expect(second).toEqual(first);
    expect(consumer.probe.count(label)).toBe(1);
    expect(await effects(label)).toBe(1);
  });

  it('answers a MessagePattern duplicate that found the key in flight from its redelivery, with the stored reply', async () => {
    const label = fresh();
    const first = queue.request('refund.quote', { label, delayMs: 1_000 }, `q-${label}`);
    await waitFor(() => consumer.probe.count(label) === 1);
    // Requeued, not answered: an empty answer now would tell this requester "no reply".
    const second = await queue.request('refund.quote', { label, delayMs: 1_000 }, `q-${label}`, 8_000);
    const expected = [{ response: { label, invocation: 1, quotedAt: '2026-01-01T00:00:00.000Z' } }];
    expect(await first).toEqual(expected);
    expect(second).toEqual(expected);
    expect(consumer.probe.count(label)).toBe(1);
  });

  it('replays a stored refusal of a MessagePattern as the same error', async () => {
    const label = fresh();
    const first = await queue.request('refund.quote', { label, refuse: true }, `q-${label}`);
    const second = await queue.request('refund.quote', { label, refuse: true }, `q-${label}`);
    expect(first).toEqual([{ err: { status: 'error', code: 'quote_refused' } }]);
    expect(second).toEqual(first);
    expect(consumer.probe.count(label)).toBe(1);
  });

  it('refuses, through the effect ledger, a message replayed from the dead-letter queue after its key expired', async () => {
    const label = fresh();
    const message = { label, ledgerKey: `refund:${label}` };
    await publish(message, `msg-${label}`);
    expect(await waitFor(async () => (await keyRow(`msg-${label}`))?.status === 'completed')).toBe(true);
    // A copy of the same message sits in the dead-letter queue (say a duplicate a broken consumer rejected).
    queue.channel.sendToQueue(queue.deadLetters, Buffer.from(JSON.stringify({ pattern: 'refund.requested', data: message })), {
      messageId: `msg-${label}`,
    });
    await queue.waitForDeadLetters(1);
    // Days later: the key has expired (its TTL passed; the sweeper may or may not have run).
    await db.query(`UPDATE idempotency_keys SET expires_at = now() - interval '1 second' WHERE key = $1`, [`msg-${label}`]);
    // An operator replays the dead-letter queue onto the work queue.
    for (const dead of await queue.takeDeadLetters()) {
      await queue.publish(dead.content.pattern, dead.content.data, { messageId: dead.messageId });
    }
    expect(await waitFor(() => consumer.probe.count(label) === 2)).toBe(true);
    expect(await queue.waitUntilDrained()).toBe(true);
    // The expired key let the handler run again; the ledger kept the effect from happening twice.
    expect(await effects(label)).toBe(1);
    const ledger = await db.query('SELECT tenant_id, scope FROM effect_ledger WHERE key = $1', [`refund:${label}`]);
    expect(ledger.rows).toEqual([{ tenant_id: 'tenant-a', scope: 'refunds' }]);
  });
});
