import { afterAll, beforeAll, expect, it } from '@jest/globals';
import { Controller, Module, type INestMicroservice } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Ctx, EventPattern, Payload } from '@nestjs/microservices';
import { TypeOrmModule } from '@nestjs/typeorm';
import type pg from 'pg';
import { Idempotent, IdempotencyModule, TransactionHost } from '../src/index.js';
import { JetStreamContext, JetStreamServer } from '../src/rpc/jetstream/index.js';
import { describeWithBroker, JetStreamFixture, NATS_URL, waitFor } from './support/brokers.js';
import { createTables, dataSourceOptions, freshSchema, sqlClient } from './support/database.js';
import { sleep } from './support/http.js';

const CONSUMER = 'backlog-worker';
const MAX_MESSAGES = 8;
const BACKLOG = 200;
/** Each handler holds its transaction this long (a slow downstream call), so handlers that may overlap do. */
const HANDLER_MS = 50;

/** What the handlers did: how many ran at once at most, and the JetStream delivery count each saw. */
class Gauge {
  running = 0;
  highWater = 0;
  readonly deliveries = new Map<string, number[]>();
}

function backlogController(subject: string, gauge: Gauge) {
  @Controller()
  class BacklogConsumer {
    constructor(private readonly tx: TransactionHost) {}

    @EventPattern<Record<string, { label: string }>>(subject)
    @Idempotent()
    async handle(@Payload() message: { label: string }, @Ctx() injected: unknown) {
      const context = injected as JetStreamContext;
      gauge.running++;
      gauge.highWater = Math.max(gauge.highWater, gauge.running);
      try {
        const seen = gauge.deliveries.get(message.label) ?? [];
        gauge.deliveries.set(message.label, [...seen, context.getJetStreamMessage().info.deliveryCount]);
        await this.tx.manager.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', ['tenant-a', message.label]);
        await sleep(HANDLER_MS);
      } finally {
        gauge.running--;
      }
    }
  }
  return BacklogConsumer;
}

/**
 * `maxMessages` bounds the handlers a `JetStreamServer` runs at once, on a
 * real NATS JetStream: a backlog waits on the server, not in the process
 * (where each message would want a transaction at the same time).
 */
describeWithBroker('nats', 'JetStreamServer under a backlog', () => {
  let schema: string;
  let db: pg.Client;
  let js: JetStreamFixture;
  let app: INestMicroservice;
  const gauge = new Gauge();

  beforeAll(async () => {
    schema = await freshSchema('jetstream_backlog');
    await createTables(schema);
    db = await sqlClient(schema);
    js = await JetStreamFixture.create('backlog');
  });
  afterAll(async () => {
    await app?.close();
    await js?.delete();
    await db?.end();
  });

  it(`runs at most maxMessages (${MAX_MESSAGES}) handlers at once over ${BACKLOG} queued messages, each once, none redelivered`, async () => {
    const subject = `${js.subject}.item`;
    for (let i = 0; i < BACKLOG; i++) await js.publish(subject, { label: `item-${i}` }, `backlog-${i}`);

    @Module({
      imports: [
        TypeOrmModule.forRoot({ ...dataSourceOptions(schema), retryAttempts: 0 }),
        IdempotencyModule.forRoot({ tenant: () => 'tenant-a', sweep: false }),
      ],
      controllers: [backlogController(subject, gauge)],
    })
    class BacklogModule {}
    app = await NestFactory.createMicroservice(BacklogModule, {
      strategy: new JetStreamServer({
        servers: NATS_URL,
        stream: { name: js.stream },
        consumer: { name: CONSUMER },
        maxMessages: MAX_MESSAGES,
      }),
      logger: false,
    });
    await app.listen();

    const completed = async () =>
      Number((await db.query(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`)).rows[0].count);
    expect(await waitFor(async () => (await completed()) === BACKLOG, 60_000)).toBe(true);
    expect(await js.waitUntilSettled(CONSUMER)).toBe(true);

    expect(gauge.highWater).toBeLessThanOrEqual(MAX_MESSAGES);
    // The bound is used, not just respected: handlers did overlap.
    expect(gauge.highWater).toBeGreaterThan(1);
    // Each message ran once, on its first delivery: no requeue (store unavailable, ack_wait run out) happened.
    expect(gauge.deliveries.size).toBe(BACKLOG);
    expect([...gauge.deliveries.values()].filter((counts) => counts.length !== 1 || counts[0] !== 1)).toEqual([]);
    const effects = await db.query('SELECT label, count(*)::int AS n FROM effects GROUP BY label HAVING count(*) <> 1');
    expect(effects.rows).toEqual([]);
    expect(Number((await db.query('SELECT count(*) FROM effects')).rows[0].count)).toBe(BACKLOG);
  });

  it('refuses a maxMessages that is not a whole number of at least 1, saying what it bounds', () => {
    for (const maxMessages of [0, -1, 2.5, Number.NaN]) {
      expect(() => new JetStreamServer({ stream: { name: js.stream }, consumer: { name: CONSUMER }, maxMessages })).toThrow(
        /maxMessages.*at least 1.*pool size/,
      );
    }
  });
});
