import { afterAll, afterEach, beforeAll, expect, it } from '@jest/globals';
import { randomUUID } from 'node:crypto';
import amqp, { type ChannelModel, type ConfirmChannel } from 'amqplib';
import { describeWithBroker, RABBITMQ_URL } from '../support/brokers.js';
import { send, sleep } from '../support/http.js';
import { API_KEY } from './support/charges.js';
import { printFigures } from './support/figures.js';
import { queueMessages } from './support/rabbitmq.js';
import { Fleet, type ExitInfo, type SampleProcess, type SampleProcessOptions } from './support/sample-process.js';
import { ScenarioDatabase } from './support/scenario-database.js';

/** Short, so the scenario waits out few seconds per crash; the restart itself takes about as long. */
const LEASE_MS = 2_000;
/** `@Idempotent()`'s default, which the sample's consumer keeps. */
const MAX_DELIVERIES = 5;
/** Refund requests published behind the poison one. */
const BEHIND = 10;
/** How long the poison message's refund hangs before its process dies. */
const POISON_HANG_MS = 1_000;
/** The supervisor's bounds: starts (the first, one per crash expected, and one spare) and time. */
const MAX_STARTS = 1 + MAX_DELIVERIES + 1;
const SUPERVISION_MS = 50_000;

/**
 * Keeps one consumer process running, as a process manager (systemd, a
 * container's restart policy) would: when it dies, it starts another at once.
 * Bounded in starts and in time, so a consumer that dies for ever fails the
 * scenario instead of hanging it.
 */
class Supervisor {
  readonly exits: ExitInfo[] = [];
  private starts = 1;

  constructor(
    private readonly fleet: Fleet,
    private readonly options: (start: number) => SampleProcessOptions,
    private current: SampleProcess,
  ) {}

  get consumer(): SampleProcess {
    return this.current;
  }

  /** Restarts the consumer whenever it dies until `done` holds; false if MAX_STARTS or `timeoutMs` came first. */
  async until(done: () => Promise<boolean>, timeoutMs: number): Promise<boolean> {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      if (!this.current.alive) {
        this.exits.push(this.current.exit!);
        if (this.starts >= MAX_STARTS) return false;
        // Not waiting for /health: the broker redelivers the poison message as soon as the consumer connects, which
        // it does before the HTTP server listens, so a start may die before it ever answers.
        this.current = await this.fleet.start({ ...this.options(++this.starts), waitForHealth: false });
      } else if (await done()) {
        return true;
      }
      await sleep(100);
    }
    return false;
  }
}

/**
 * A poison message that kills its consumer: a refund request whose
 * `simulate.crash` is `every-delivery` SIGKILLs the sample-app process before
 * its commit on every delivery. Each death leaves the key in flight with its
 * attempt counted; the consumer is restarted as a process manager would, and
 * the delivery after the fifth attempt is dead-lettered before its handler
 * runs, so the restarts end. Real processes, real RabbitMQ, refunds counted
 * in PostgreSQL.
 */
describeWithBroker('rabbitmq', 'a poison message that kills the consumer on every delivery (RabbitMQ, real processes)', () => {
  let db: ScenarioDatabase;
  let connection: ChannelModel;
  let channel: ConfirmChannel;
  let fleet: Fleet;
  const queue = `reliability-poison-${randomUUID().slice(0, 8)}`;
  const deadLetters = `${queue}.dead`;

  const consumerOptions = (start: number): SampleProcessOptions => ({
    name: `consumer-start-${start}`,
    adapter: start % 2 === 1 ? 'express' : 'fastify',
    databaseUrl: db.url,
    env: { RABBITMQ_URL, REFUND_QUEUE: queue, IDEMPOTENCY_LEASE_MS: String(LEASE_MS), SAMPLE_FAULT_INJECTION: '1' },
  });
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
  const depth = async (name: string) => (await channel.checkQueue(name)).messageCount;
  /** One query at a time: the scenario's client is a single connection. */
  const each = async <T>(refundIds: string[], read: (refundId: string) => Promise<T>) => {
    const values: T[] = [];
    for (const refundId of refundIds) values.push(await read(refundId));
    return values;
  };

  beforeAll(async () => {
    // A database of this file's own: scenario databases are named after their scenario, and others run at once.
    db = await ScenarioDatabase.create(`poison_consumer_${randomUUID().slice(0, 8)}`);
    connection = await amqp.connect(RABBITMQ_URL);
    channel = await connection.createConfirmChannel();
    fleet = new Fleet();
  });
  afterEach(async () => {
    await fleet?.stopAll();
  });
  afterAll(async () => {
    await channel?.deleteQueue(queue).catch(() => undefined);
    await channel?.deleteQueue(deadLetters).catch(() => undefined);
    await connection?.close().catch(() => undefined);
    await db?.drop();
  });

  it('is dead-lettered after maxDeliveries crashes, refunds nothing, and every message behind it is refunded once', () =>
    fleet.explain(async () => {
      const first = await fleet.start(consumerOptions(1));
      const charge = await send(first.url, 'POST', '/charges', {
        headers: [
          ['Authorization', `Bearer ${API_KEY}`],
          ['Idempotency-Key', randomUUID()],
        ],
        body: { amount: 100_000, currency: 'eur', customer: 'cus_poison' },
      });
      expect(charge.status).toBe(201);
      const chargeId = charge.json().id as string;
      const request = (refundId: string, simulate?: Record<string, unknown>) => ({
        tenant: 'tenant-a',
        refundId,
        chargeId,
        amount: 100,
        ...(simulate ? { simulate } : {}),
      });

      const poison = `rf-poison-${randomUUID()}`;
      const behind = Array.from({ length: BEHIND }, () => `rf-${randomUUID()}`);
      const started = Date.now();
      // The refund processor hangs a second, then the process dies: the requests delivered with it finish first. (Without
      // the hang, each death also takes down the deliveries in flight beside it, and counts an attempt of theirs.)
      await publish(request(poison, { crash: 'every-delivery', delayMs: POISON_HANG_MS }), `msg-${poison}`);
      for (const refundId of behind.slice(0, BEHIND / 2)) await publish(request(refundId), `msg-${refundId}`);
      expect(await Promise.race([first.exited, sleep(SUPERVISION_MS).then(() => 'still running')])).toEqual({
        code: null,
        signal: 'SIGKILL',
      });
      // Half of them published while no consumer runs: queued behind the poison message's redelivery.
      for (const refundId of behind.slice(BEHIND / 2)) await publish(request(refundId), `msg-${refundId}`);

      const supervisor = new Supervisor(fleet, consumerOptions, first);
      const settled = async () =>
        (await depth(deadLetters)) === 1 &&
        (await queueMessages(queue)) === 0 &&
        (await each(behind, refunds)).every((count) => count === 1);
      expect(await supervisor.until(settled, SUPERVISION_MS)).toBe(true);
      const elapsedMs = Date.now() - started;

      // Killed before its commit on each of its maxDeliveries attempts; the next delivery was dead-lettered unrun.
      expect(supervisor.exits).toEqual(Array.from({ length: MAX_DELIVERIES }, () => ({ code: null, signal: 'SIGKILL' })));
      const survivor = supervisor.consumer;
      await survivor.waitHealthy();
      expect(survivor.alive).toBe(true);
      expect(survivor.printed(new RegExp(`dead-lettered: it was already attempted ${MAX_DELIVERIES} times`))).toBe(true);
      expect(await refunds(poison)).toBe(0);
      // Its key was released with the dead letter, so a redrive after a fix starts with a fresh count.
      expect(await keyRow(`msg-${poison}`)).toBeUndefined();
      const dead = await channel.get(deadLetters, { noAck: true });
      expect(dead && dead.properties.messageId).toBe(`msg-${poison}`);
      expect(await depth(deadLetters)).toBe(0);

      // Behind it, each request was refunded once, whichever consumer's death it lived through.
      for (const refundId of behind) {
        expect(await refunds(refundId)).toBe(1);
        expect((await keyRow(`msg-${refundId}`))?.status).toBe('completed');
      }
      // And the survivor takes none of it again: nothing is left to deliver, and it stays alive.
      await sleep(LEASE_MS);
      expect(await queueMessages(queue)).toBe(0);
      expect(survivor.alive).toBe(true);
      printFigures('consumers/poison-crash', {
        crashes: supervisor.exits.length,
        poisonRefunds: await refunds(poison),
        behind: BEHIND,
        behindRefunded: (await each(behind, refunds)).filter((count) => count === 1).length,
        maxBehindAttempts: Math.max(...(await each(behind, async (id) => (await keyRow(`msg-${id}`))!.attempt))),
        settledInMs: elapsedMs,
      });
    }));
});
