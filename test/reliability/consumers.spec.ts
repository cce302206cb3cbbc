import { afterAll, afterEach, beforeAll, beforeEach, expect, it } from '@jest/globals';
import { randomUUID } from 'node:crypto';
import amqp, { type ChannelModel, type ConfirmChannel } from 'amqplib';
import { describeWithBroker, RABBITMQ_URL, waitFor } from '../support/brokers.js';
import { send, sleep } from '../support/http.js';
import { API_KEY } from './support/charges.js';
import { printFigures } from './support/figures.js';
import { queueMessages } from './support/rabbitmq.js';
import { Fleet, type SampleProcess } from './support/sample-process.js';
import { ScenarioDatabase } from './support/scenario-database.js';

/** Short enough to wait out, long enough that a redelivery right after a crash meets it. */
const LEASE_MS = 2_000;
const MAX_DELIVERIES = 5;

/**
 * Message consumers on a real RabbitMQ: sample-app processes consuming
 * `refund.requested` (manual acks, a dead-letter queue), killed with SIGKILL
 * at the worst moments, with refunds counted in PostgreSQL.
 */
describeWithBroker('rabbitmq', 'idempotent message consumers on RabbitMQ, real processes', () => {
  let db: ScenarioDatabase;
  let connection: ChannelModel;
  let channel: ConfirmChannel;
  let fleet: Fleet;
  let queue: string;
  let chargeId: string;

  const consumerEnv = (faults: boolean) => ({
    RABBITMQ_URL,
    REFUND_QUEUE: queue,
    IDEMPOTENCY_LEASE_MS: String(LEASE_MS),
    ...(faults ? { SAMPLE_FAULT_INJECTION: '1' } : {}),
  });
  const start = (name: string, faults: boolean, adapter: 'express' | 'fastify' = 'express') =>
    fleet.start({ name, adapter, databaseUrl: db.url, env: consumerEnv(faults) });
  const publish = async (data: Record<string, unknown>, messageId: string) => {
    channel.sendToQueue(queue, Buffer.from(JSON.stringify({ pattern: 'refund.requested', data })), {
      messageId,
      persistent: true,
    });
    await channel.waitForConfirms();
  };
  const refunds = async (refundId: string) =>
    Number((await db.client.query('SELECT count(*) FROM refunds WHERE refund_id = $1', [refundId])).rows[0].count);
  const keyRow = async (key: string) =>
    (await db.client.query('SELECT status, attempt FROM idempotency_keys WHERE key = $1', [key])).rows[0] as
      { status: string; attempt: number } | undefined;
  const depth = async (name = queue) => (await channel.checkQueue(name)).messageCount;
  /**
   * Nothing left in the queue, ready or delivered and unacknowledged (a copy
   * held while it waits out a Retry-After is unacknowledged): every copy was
   * settled. AMQP counts only ready messages, so ask the broker's own CLI.
   */
  const drained = async () => (await queueMessages(queue)) === 0;
  const refundRequest = (refundId: string, simulate?: Record<string, unknown>) => ({
    tenant: 'tenant-a',
    refundId,
    chargeId,
    amount: 100,
    ...(simulate ? { simulate } : {}),
  });

  beforeAll(async () => {
    db = await ScenarioDatabase.create('consumers');
    connection = await amqp.connect(RABBITMQ_URL);
    channel = await connection.createConfirmChannel();
  });
  afterAll(async () => {
    await connection?.close().catch(() => undefined);
    await db?.drop();
  });

  // A queue and processes per scenario, so no scenario sees another's messages or crashes.
  beforeEach(async () => {
    queue = `reliability-refunds-${randomUUID().slice(0, 8)}`;
    fleet = new Fleet();
    // A charge to refund, made through one process's API, which then stops: each scenario starts its own consumers.
    const maker = await fleet.start({
      name: 'charge-maker',
      adapter: 'express',
      databaseUrl: db.url,
      env: { REFUND_QUEUE: queue },
    });
    const res = await send(maker.url, 'POST', '/charges', {
      headers: [
        ['Authorization', `Bearer ${API_KEY}`],
        ['Idempotency-Key', randomUUID()],
      ],
      body: { amount: 100_000, currency: 'eur', customer: 'cus_refunds' },
    });
    expect(res.status).toBe(201);
    chargeId = res.json().id as string;
    await maker.stop();
  });
  afterEach(async () => {
    await fleet?.stopAll();
    await channel.deleteQueue(queue).catch(() => undefined);
    await channel.deleteQueue(`${queue}.dead`).catch(() => undefined);
  });

  it('SIGKILL after the commit, before the ack: the redelivery is acknowledged as a replay, one refund', () =>
    fleet.explain(async () => {
      const refundId = `rf-${randomUUID()}`;
      const key = `msg-${refundId}`;
      const doomed = await start('crash-after-commit', true);
      await publish(refundRequest(refundId, { crash: 'after-commit' }), key);
      expect(await doomed.exited).toEqual({ code: null, signal: 'SIGKILL' });
      // It died acknowledging: the refund and the completion had committed, the message had not been acked.
      const committedAtCrash = await refunds(refundId);
      expect(committedAtCrash).toBe(1);
      expect(await keyRow(key)).toEqual({ status: 'completed', attempt: 1 });

      const survivor = await start('survivor', false, 'fastify');
      expect(await waitFor(drained)).toBe(true);
      expect(await refunds(refundId)).toBe(1);
      expect(await keyRow(key)).toEqual({ status: 'completed', attempt: 1 });
      expect(await depth(`${queue}.dead`)).toBe(0);
      expect(survivor.alive).toBe(true);
      printFigures('consumers/crash-after-commit', {
        refundsAtCrash: committedAtCrash,
        refundsInTheEnd: await refunds(refundId),
        deadLetters: await depth(`${queue}.dead`),
      });
    }));

  it('SIGKILL after the insert, before the commit: nothing committed; the redelivery waits out the lease, then refunds once', () =>
    fleet.explain(async () => {
      const refundId = `rf-${randomUUID()}`;
      const key = `msg-${refundId}`;
      const doomed = await start('crash-before-commit', true);
      await publish(refundRequest(refundId, { crash: 'before-commit' }), key);
      expect(await doomed.exited).toEqual({ code: null, signal: 'SIGKILL' });
      const refundsAtCrash = await refunds(refundId);
      expect(refundsAtCrash).toBe(0);
      expect(await keyRow(key)).toEqual({ status: 'in_flight', attempt: 1 });

      await start('survivor', false, 'fastify');
      expect(await waitFor(async () => (await keyRow(key))?.status === 'completed', 30_000)).toBe(true);
      expect(await waitFor(drained)).toBe(true);
      expect(await refunds(refundId)).toBe(1);
      // The redelivery took the key over once the crashed attempt's lease ended.
      expect(await keyRow(key)).toEqual({ status: 'completed', attempt: 2 });
      printFigures('consumers/crash-before-commit', {
        refundsAtCrash,
        refundsInTheEnd: await refunds(refundId),
        attempts: (await keyRow(key))!.attempt,
      });
    }));

  it('200 duplicate publishes across three consumer processes: one refund, every copy acknowledged, none dead-lettered', () =>
    fleet.explain(async () => {
      const refundId = `rf-${randomUUID()}`;
      const key = `msg-${refundId}`;
      const consumers: SampleProcess[] = await fleet.startAll([
        { name: 'consumer-1', adapter: 'express', databaseUrl: db.url, env: consumerEnv(false) },
        { name: 'consumer-2', adapter: 'fastify', databaseUrl: db.url, env: consumerEnv(false) },
        { name: 'consumer-3', adapter: 'express', databaseUrl: db.url, env: consumerEnv(false) },
      ]);
      // A slow refund processor, so most copies arrive while the first holds the key.
      const message = refundRequest(refundId, { delayMs: 500 });
      const started = Date.now();
      for (let i = 0; i < 200; i++)
        channel.sendToQueue(queue, Buffer.from(JSON.stringify({ pattern: 'refund.requested', data: message })), {
          messageId: key,
        });
      await channel.waitForConfirms();
      expect(await waitFor(async () => (await keyRow(key))?.status === 'completed', 30_000)).toBe(true);
      expect(await waitFor(drained, 60_000)).toBe(true);
      const elapsedMs = Date.now() - started;
      expect(await refunds(refundId)).toBe(1);
      expect(await depth(`${queue}.dead`)).toBe(0);
      expect(await keyRow(key)).toEqual({ status: 'completed', attempt: 1 });
      expect(consumers.every((c) => c.alive)).toBe(true);
      printFigures('consumers/duplicate-storm', {
        publishes: 200,
        consumers: consumers.length,
        refunds: await refunds(refundId),
        deadLetters: await depth(`${queue}.dead`),
        drainedInMs: elapsedMs,
      });
    }));

  it('a poison message (its refund fails on every delivery) ends dead-lettered after maxDeliveries, not looping', () =>
    fleet.explain(async () => {
      const refundId = `rf-${randomUUID()}`;
      const key = `msg-${refundId}`;
      await fleet.startAll([
        { name: 'consumer-1', adapter: 'express', databaseUrl: db.url, env: consumerEnv(false) },
        { name: 'consumer-2', adapter: 'fastify', databaseUrl: db.url, env: consumerEnv(false) },
      ]);
      await publish(refundRequest(refundId, { fail: true }), key);
      expect(await waitFor(async () => (await depth(`${queue}.dead`)) === 1, MAX_DELIVERIES * LEASE_MS + 20_000)).toBe(true);
      const attempts = (await keyRow(key))!.attempt;
      expect(attempts).toBe(MAX_DELIVERIES);
      // Two more leases: nobody takes it again, and nothing of it ever committed.
      await sleep(2 * LEASE_MS);
      expect((await keyRow(key))!.attempt).toBe(MAX_DELIVERIES);
      expect(await depth()).toBe(0);
      expect(await depth(`${queue}.dead`)).toBe(1);
      expect(await refunds(refundId)).toBe(0);
      const dead = await channel.get(`${queue}.dead`, { noAck: true });
      expect(dead && dead.properties.messageId).toBe(key);
      printFigures('consumers/poison', { attempts, refunds: await refunds(refundId), deadLetters: 1 });
    }));
});
